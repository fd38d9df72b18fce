package integration

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/cuckooguard/cuckooguard/examples/internal/pgtest"
	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/keyspell"
	"github.com/cuckooguard/cuckooguard/middleware"
	"github.com/cuckooguard/cuckooguard/postgres"
	"github.com/cuckooguard/cuckooguard/rpcguard"
)

// The service of the spellings test, with no generated code: a text key
// (a string field) and a bytea key (a bytes field), each in a request of
// the well-known wrapper types, which rpcguard resolves through the
// protobuf registry as it does a generated service's.
const (
	spellService = "cuckooguard.examples.integration.spell.v1.Keys"
	textMethod   = "/" + spellService + "/Text"  // google.protobuf.StringValue: rpcguard.Field[string]("value")
	byteaMethod  = "/" + spellService + "/Bytea" // google.protobuf.BytesValue: rpcguard.Bytea("value")
)

// registerSpellService registers the descriptor of spellService, once.
var registerSpellService = sync.OnceValue(func() error {
	method := func(name, in string) *descriptorpb.MethodDescriptorProto {
		return &descriptorpb.MethodDescriptorProto{Name: proto.String(name), InputType: proto.String(in), OutputType: proto.String(".google.protobuf.Empty")}
	}
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name:       proto.String("cuckooguard/examples/integration/spell.proto"),
		Package:    proto.String("cuckooguard.examples.integration.spell.v1"),
		Syntax:     proto.String("proto3"),
		Dependency: []string{"google/protobuf/wrappers.proto", "google/protobuf/empty.proto"},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Keys"), Method: []*descriptorpb.MethodDescriptorProto{
			method("Text", ".google.protobuf.StringValue"), method("Bytea", ".google.protobuf.BytesValue"),
		}}},
	}, protoregistry.GlobalFiles)
	if err != nil {
		return err
	}
	return protoregistry.GlobalFiles.RegisterFile(fd)
})

// absentSpellings are texts of each type that no row of keyspell's
// groups has: the guard should answer most of them itself. Each is asked
// of the database too; one it finds, or cannot read, is not counted.
var absentSpellings = map[string][]string{
	"character(5)":     {"zz", "ab_", "AB", "cdef ", "m"},
	"citext":           {"nobody@example.com", "Alice@Example.org", "ALICE@EXAMPLE.CO", "Émil@Exemple.fr"},
	"numeric":          {"1.51", "3", "-1.5", "1e3", "15e-2", "Infinity"},
	"numeric(10,2)":    {"1.51", "5", "2.2"},
	"double precision": {"0.2", "-Infinity", "1e-300", "1.25"},
	"real":             {"0.2", "2.5", "-1"},
	"timestamptz":      {"2026-01-02 03:04:06+00", "2026-01-02 03:04:05+01", "2027-02-03T04:05:06Z", "-infinity"},
	"timestamp":        {"2026-01-02 03:04:06", "2026-01-03", "2027-02-03T04:05:06.5"},
	"date":             {"2026-01-03", "2027-2-4", "-infinity"},
	"interval":         {"2 mons", "25 hours", "-1 days", "01:30:01"},
	"inet":             {"10.0.0.2", "10.1.0.0/15", "fe80::2", "::ffff:1.2.3.5"},
	"cidr":             {"10.0.0.0/9", "192.168.1.8", "2001:db8::/31"},
	"bytea":            {`\x0103`, `abd`, `\xdeadbeee`},
	"uuid":             {"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A12", "{b1ffcd00-0000-4000-8000-000000000002}"},
	"bigint":           {"6", "-43", "9223372036854775806", "+70"},
	"text":             {"ALICE@EXAMPLE.COM", "ab", "Bob ", "Emile"},
	"enum":             {"angry"}, // a label the test adds, with no row
}

// moreGroups are keys this test adds to keyspell's, written while the
// follower follows. A bytea key whose bytes read as bytea's hex input
// (the four bytes \x41, not the byte 0x41): sent as raw bytes in a
// rpcguard.Field, the key rule reads them as the byte 0x41 and the guard
// answers NotFound; rpcguard.Bytea sends their own text.
var moreGroups = map[string][][]string{
	"bytea": {{`\x5c783431`, `\\x41`}},
}

// frontCounts are one front's answers for one key type.
type frontCounts struct {
	present, wrong   int // spellings whose row the database finds; of those, answered NotFound by the guard
	absent, rejected int // spellings the database finds no row for; of those, answered by the guard
}

// TestKeyTypeSpellingsThroughFronts is issue 49's raw spellings through
// the fronts: a table of each key type of the README's table, with rows
// written by another client before and while a direct follower follows
// it, and every spelling of package keyspell that the database reads as a
// stored key sent as a client sends it, raw, through the HTTP middleware
// (a path value), rpcguard over gRPC and over Connect (a Field of a string
// field; for bytea also rpcguard.Bytea of a bytes field, with the bytes
// the database reads the spelling as). The Loader's key rule, which the
// follower installs, is all that makes them one key: 0 wrong 404s (a
// spelling whose row the database finds, answered NotFound by the guard).
// Spellings of absent keys are sent too, and the guard must answer them.
func TestKeyTypeSpellingsThroughFronts(t *testing.T) {
	if testing.Short() {
		t.Skip("follows a table per key type")
	}
	if err := registerSpellService(); err != nil {
		t.Fatal(err)
	}
	dsn := withPublic(t, pgtest.Schema(t, pgtest.DSN(t)))
	ctx := context.Background()
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	total := map[string]*frontCounts{}
	var fronts []string
	var perType []string // a line per type, for the closing summary
	for i, c := range keyspell.Types() {
		for _, domain := range []bool{false, true} {
			name := c.Name
			if domain {
				name = "domain over " + c.Name
			}
			t.Run(name, func(t *testing.T) {
				counts := spellThroughFronts(t, db, dsn, fmt.Sprintf("spell_%d", i), c, domain)
				line := fmt.Sprintf("%-30s", name+":")
				defer func() { perType = append(perType, line) }()
				for _, front := range sortedFronts(counts) {
					n := counts[front]
					t.Logf("%-13s %3d spellings of stored keys, %d wrong 404s; %3d of absent keys, %d answered by the guard", front, n.present, n.wrong, n.absent, n.rejected)
					if n.present == 0 {
						t.Errorf("%s: no spelling of a stored key checked", front)
					}
					if n.absent > 0 && n.rejected == 0 {
						t.Errorf("%s: none of %d absent keys answered by the guard: the front does not ask it", front, n.absent)
					}
					line += fmt.Sprintf(" %s %d/%d wrong, absent %d/%d;", front, n.present, n.wrong, n.rejected, n.absent)
					if total[front] == nil {
						total[front] = &frontCounts{}
						fronts = append(fronts, front)
					}
					s := total[front]
					s.present, s.wrong, s.absent, s.rejected = s.present+n.present, s.wrong+n.wrong, s.absent+n.absent, s.rejected+n.rejected
				}
			})
		}
	}
	t.Log("by type and front: spellings of stored keys / wrong 404s, absent keys answered by the guard / sent")
	for _, l := range perType {
		t.Log(l)
	}
	for _, front := range fronts {
		n := total[front]
		t.Logf("all types, %-13s %4d spellings of stored keys, %d wrong 404s; %3d of absent keys, %d answered by the guard", front+":", n.present, n.wrong, n.absent, n.rejected)
	}
}

// sortedFronts returns the fronts of counts in the order they are
// reported.
func sortedFronts(counts map[string]*frontCounts) []string {
	var out []string
	for _, f := range []string{"http", "grpc", "connect", "grpc bytes", "connect bytes"} {
		if counts[f] != nil {
			out = append(out, f)
		}
	}
	return out
}

// withPublic returns dsn with public after its schema in the search path:
// citext's operators are there.
func withPublic(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", q.Get("search_path")+",public")
	u.RawQuery = q.Encode()
	return u.String()
}

// spellThroughFronts follows a table of c's type (with domain, of a domain
// over it) and sends its spellings through each front; it returns the
// counts by front. The type's setup runs with the table of the type
// itself, which comes first.
func spellThroughFronts(t *testing.T, db *pgx.Conn, dsn, table string, c keyspell.Type, domain bool) map[string]*frontCounts {
	t.Helper()
	ctx := context.Background()
	for _, s := range c.Setup {
		switch {
		case s == "citext":
			ensureCitext(t, db)
		case !domain: // the type's table made the rest
			exec(t, db, s)
		}
	}
	typ := c.Type
	if domain {
		table += "_domain"
		typ = table + "_key"
		exec(t, db, `CREATE DOMAIN `+typ+` AS `+c.Type)
	}
	if c.Name == "enum" && !domain {
		exec(t, db, `ALTER TYPE mood ADD VALUE 'angry'`) // a label with no row, for absentSpellings
	}
	exec(t, db, `CREATE TABLE `+table+` (k `+typ+` PRIMARY KEY, v text)`)
	insertFirst := func(groups [][]string) {
		for _, g := range groups {
			// As another client writes a key: a text the server reads as
			// the column's type.
			if _, err := db.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, 'other')`, pgx.QueryExecModeSimpleProtocol, g[0]); err != nil {
				t.Fatalf("insert %q: %v", g[0], err)
			}
		}
	}
	insertFirst(c.Seed)
	if err := postgres.Publish(ctx, db, table, "k"); err != nil {
		t.Fatal(err)
	}
	loader := followTable(t, db, dsn, table)
	insertFirst(c.Later)
	insertFirst(c.Own)
	insertFirst(moreGroups[c.Name])
	loader.waitCovers(t, time.Now())

	fr := startFronts(t, loader.Loader)
	counts := map[string]*frontCounts{}
	all := append(append(append(append([][]string{}, c.Seed...), c.Later...), c.Own...), moreGroups[c.Name]...)
	var spellings []string
	for _, g := range all {
		spellings = append(spellings, g...)
	}
	spellings = append(spellings, absentSpellings[c.Name]...)
	for _, s := range spellings {
		var found bool
		// As PostgreSQL judges a lookup: the spelling as a parameter,
		// which the server reads as the column's type.
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+table+` WHERE `+cmp.Or(c.Lookup, "k = $1")+`)`, pgx.QueryExecModeSimpleProtocol, s).Scan(&found)
		if err != nil {
			t.Logf("%q: the database does not read it (%v): not sent", s, err)
			continue
		}
		sends := []send{
			{"http", func() (bool, error) { return fr.getHTTP(s) }},
			{"grpc", func() (bool, error) { return fr.callGRPC(textMethod, &wrapperspb.StringValue{Value: s}) }},
			{"connect", func() (bool, error) { return callConnect(fr.connectText, &wrapperspb.StringValue{Value: s}) }},
		}
		if c.Name == "bytea" {
			// A client of a bytes field sends the bytes, which the
			// database reads the spelling as.
			var b []byte
			if err := db.QueryRow(ctx, `SELECT $1::bytea`, pgx.QueryExecModeSimpleProtocol, s).Scan(&b); err != nil {
				t.Fatal(err)
			}
			sends = append(sends,
				send{"grpc bytes", func() (bool, error) { return fr.callGRPC(byteaMethod, &wrapperspb.BytesValue{Value: b}) }},
				send{"connect bytes", func() (bool, error) { return callConnect(fr.connectBytea, &wrapperspb.BytesValue{Value: b}) }})
		}
		for _, sd := range sends {
			rejected, err := loader.whileReady(t, sd.send)
			if err != nil {
				t.Fatalf("%s, %q: %v", sd.front, s, err)
			}
			n := counts[sd.front]
			if n == nil {
				n = &frontCounts{}
				counts[sd.front] = n
			}
			switch {
			case found && rejected:
				n.present++
				n.wrong++
				t.Errorf("a wrong 404 through %s: %q answered NotFound by the guard, and the database finds its row", sd.front, s)
			case found:
				n.present++
			case rejected:
				n.absent++
				n.rejected++
			default:
				n.absent++
				t.Logf("%s: %q, of an absent key, passed to the handler (a false positive of the guard, or a text the key rule cannot judge)", sd.front, s)
			}
		}
	}
	return counts
}

// send is a spelling's request through one front: it reports whether the
// guard answered NotFound.
type send struct {
	front string
	send  func() (rejected bool, err error)
}

// ensureCitext makes sure the citext extension exists, in public, or
// skips the test. Another test's session may be creating it at once.
func ensureCitext(t *testing.T, db *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS citext SCHEMA public`)
	if err == nil {
		return
	}
	var ok bool
	if db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citext')`).Scan(&ok); !ok {
		t.Skipf("citext is not available: %v", err)
	}
}

func exec(t *testing.T, db *pgx.Conn, sql string) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// followed is a Loader of string keys kept by a direct follower.
type followed struct {
	*guarded.Loader[string, string]
	f *postgres.Follower[string]
}

// followTable returns a Loader of table's keys, followed until the test
// ends, once its follower follows.
func followTable(t *testing.T, db *pgx.Conn, dsn, table string) *followed {
	t.Helper()
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	// The fronts never load a row: they only ask the guard.
	l, err := guarded.New(g, guarded.GetterFunc[string, string](func(context.Context, string) (string, error) {
		return "", guarded.ErrNotFound
	}))
	if err != nil {
		t.Fatal(err)
	}
	f, err := postgres.NewFollower(l, dsn, table, "k", func(s string) (string, error) { return s, nil },
		postgres.WithOrigin("spell"), postgres.WithHeartbeat(100*time.Millisecond), postgres.WithLogger(discard))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("follower of %s: %v", table, err)
		}
		l.Close()
		if err := postgres.Unpublish(context.Background(), db, table); err != nil {
			t.Errorf("unpublish %s: %v", table, err)
		}
	})
	fl := &followed{Loader: l, f: f}
	fl.waitCovers(t, time.Now())
	return fl
}

// waitCovers waits until the follower follows and has applied every
// change committed before since, and the Loader answers on its own.
func (fl *followed) waitCovers(t *testing.T, since time.Time) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st := fl.f.Stats()
		if st.State == postgres.Following && st.CurrentAsOf.After(since) && fl.Ready() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower does not cover what was committed %v ago: %+v", time.Since(since), st)
		}
	}
}

// whileReady returns what send returns, sent while the Loader is ready:
// a pause of the process (a loaded machine) can outlast the Loader's
// readiness, and the fronts then pass every key, which is no answer of
// the guard's. A pass counts only if the Loader is ready after it too.
func (fl *followed) whileReady(t *testing.T, send func() (bool, error)) (rejected bool, err error) {
	t.Helper()
	for range 100 {
		fl.waitCovers(t, time.Time{})
		if rejected, err = send(); err != nil || rejected || fl.Ready() {
			return rejected, err
		}
	}
	t.Fatal("the Loader is not ready after 100 sends in a row")
	return false, nil
}

// fronts are the HTTP middleware, and rpcguard over gRPC and Connect, in
// front of handlers that always answer: a NotFound is the guard's.
type fronts struct {
	httpURL string
	seen    func() string // the key text the middleware took from the last request
	cc      *grpc.ClientConn

	connectText  *connect.Client[wrapperspb.StringValue, emptypb.Empty]
	connectBytea *connect.Client[wrapperspb.BytesValue, emptypb.Empty]
}

// startFronts serves l's guard through each front until the test ends.
func startFronts(t *testing.T, l *guarded.Loader[string, string]) *fronts {
	t.Helper()
	fr := &fronts{}
	// HTTP: the raw path value is the key; the Loader's rule reads it.
	var mu sync.Mutex
	var last string
	fr.seen = func() string { mu.Lock(); defer mu.Unlock(); return last }
	key := middleware.PathValue("k")
	mw, err := middleware.New(l, func(r *http.Request) (string, bool) {
		s, ok := key(r)
		mu.Lock()
		last = s
		mu.Unlock()
		return s, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /keys/{k...}", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "reached")
	})))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	fr.httpURL = hs.URL

	ic, err := rpcguard.New(l, rpcguard.Keys[string]{textMethod: rpcguard.Field[string]("value"), byteaMethod: rpcguard.Bytea("value")})
	if err != nil {
		t.Fatal(err)
	}
	// gRPC, with a service description of our own.
	unary := func(method string, in func() proto.Message) grpc.MethodDesc {
		return grpc.MethodDesc{MethodName: method[strings.LastIndex(method, "/")+1:], Handler: func(srv any, ctx context.Context, dec func(any) error, next grpc.UnaryServerInterceptor) (any, error) {
			req := in()
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(context.Context, any) (any, error) { return &emptypb.Empty{}, nil }
			if next == nil {
				return h(ctx, req)
			}
			return next(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, h)
		}}
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()))
	gs.RegisterService(&grpc.ServiceDesc{ServiceName: spellService, HandlerType: (*any)(nil), Methods: []grpc.MethodDesc{
		unary(textMethod, func() proto.Message { return new(wrapperspb.StringValue) }),
		unary(byteaMethod, func() proto.Message { return new(wrapperspb.BytesValue) }),
	}}, struct{}{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	if fr.cc, err = grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fr.cc.Close() })

	// Connect.
	cmux := http.NewServeMux()
	cmux.Handle(textMethod, connect.NewUnaryHandler(textMethod, func(context.Context, *connect.Request[wrapperspb.StringValue]) (*connect.Response[emptypb.Empty], error) {
		return connect.NewResponse(&emptypb.Empty{}), nil
	}, connect.WithInterceptors(ic)))
	cmux.Handle(byteaMethod, connect.NewUnaryHandler(byteaMethod, func(context.Context, *connect.Request[wrapperspb.BytesValue]) (*connect.Response[emptypb.Empty], error) {
		return connect.NewResponse(&emptypb.Empty{}), nil
	}, connect.WithInterceptors(ic)))
	cs := httptest.NewServer(cmux)
	t.Cleanup(cs.Close)
	hc := cs.Client()
	t.Cleanup(hc.CloseIdleConnections)
	fr.connectText = connect.NewClient[wrapperspb.StringValue, emptypb.Empty](hc, cs.URL+textMethod)
	fr.connectBytea = connect.NewClient[wrapperspb.BytesValue, emptypb.Empty](hc, cs.URL+byteaMethod)
	return fr
}

// getHTTP sends GET /keys/{s} and reports whether the middleware answered
// 404; it checks that the middleware read s itself from the path.
func (fr *fronts) getHTTP(s string) (rejected bool, err error) {
	resp, err := http.Get(fr.httpURL + "/keys/" + url.PathEscape(s))
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return false, err
	}
	if got := fr.seen(); got != s {
		return false, fmt.Errorf("the middleware read the key %q from the path, want %q", got, s)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound && resp.Header.Get("Content-Type") == "application/problem+json":
		return true, nil
	case resp.StatusCode == http.StatusOK && string(body) == "reached":
		return false, nil
	}
	return false, fmt.Errorf("status %s, body %q: neither the handler's nor the guard's", resp.Status, body)
}

// callGRPC calls method with req and reports whether the guard answered
// NotFound.
func (fr *fronts) callGRPC(method string, req proto.Message) (rejected bool, err error) {
	return guardAnswered(fr.cc.Invoke(context.Background(), method, req, new(emptypb.Empty)))
}

// callConnect calls c with req and reports whether the guard answered
// NotFound.
func callConnect[Req any](c *connect.Client[Req, emptypb.Empty], req *Req) (rejected bool, err error) {
	_, err = c.CallUnary(context.Background(), connect.NewRequest(req))
	return guardAnswered(err)
}

// guardAnswered reports whether err, a call's error, is the guard's
// NotFound (rpcguard's default rejection, whose ErrorInfo FromGuard
// reads); any other error is returned: the handlers never fail.
func guardAnswered(err error) (bool, error) {
	switch {
	case err == nil:
		return false, nil
	case rpcguard.FromGuard(err):
		return true, nil
	}
	return false, err
}
