// Package loadgen drives and observes a PostgreSQL server for the
// measurements of the modules that follow one (postgres, fanout): it runs
// pgbench and reads a process's CPU time. Tests only; it imports nothing
// outside the standard library, so the core module's requirements do not
// change.
package loadgen

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Server is where pgbench connects.
type Server struct {
	Host       string
	Port       int
	User       string
	Database   string
	SearchPath string // the schema the tables are in; "" for the default
}

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// Inserts runs pgbench against s for d with clients clients, each
// inserting rows (id, 'bench') of random ids into table, and returns the
// transactions per second it reports. args go to pgbench as they are (a
// fixed rate: "-R", "2000"). dir holds the script.
func Inserts(s Server, dir, table string, clients int, d time.Duration, args ...string) (float64, error) {
	script := filepath.Join(dir, "insert-"+table+".sql")
	body := fmt.Sprintf("\\set id random(1, 1000000000000)\nINSERT INTO %s (id, name) VALUES (:id, 'bench') ON CONFLICT DO NOTHING;\n", table)
	if err := os.WriteFile(script, []byte(body), 0o644); err != nil {
		return 0, err
	}
	cmd := exec.Command("pgbench", "-n", "-h", s.Host, "-p", strconv.Itoa(s.Port), "-U", s.User,
		"-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, 4)), "-T", strconv.Itoa(int(d.Seconds())),
		"-f", script)
	cmd.Args = append(append(cmd.Args, args...), s.Database)
	cmd.Env = os.Environ()
	if s.SearchPath != "" {
		cmd.Env = append(cmd.Env, "PGOPTIONS=-c search_path="+s.SearchPath)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("pgbench: %v\n%s", err, out)
	}
	m := tpsLine.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench printed no tps:\n%s", out)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// CPUSeconds returns the CPU time (user and system) process pid has used,
// from /proc; 0 for a process that is gone.
func CPUSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command may hold spaces: fields count from its closing ")".
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// ServerCPUSeconds returns the CPU time that every process named postgres
// on this machine has used, from /proc, with the CPU time of those that
// exited while they were counted: the cost of a workload to a local
// server, between two calls, as long as no backend exits between them.
func ServerCPUSeconds() float64 {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	total := 0.0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
			continue
		}
		total += CPUSeconds(pid)
	}
	return total
}
