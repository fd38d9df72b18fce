package metrics_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/metrics"
)

func ExampleNewLoaderCollector() {
	rows := map[int64]string{1: "Ada", 2: "Grace"}
	g, err := guard.New()
	if err != nil {
		panic(err)
	}
	loader, err := guarded.New(g, guarded.GetterFunc[int64, string](func(_ context.Context, id int64) (string, error) {
		if v, ok := rows[id]; ok {
			return v, nil
		}
		return "", guarded.ErrNotFound
	}))
	if err != nil {
		panic(err)
	}
	defer loader.Close()
	ctx := context.Background()
	loader.Fill(ctx, func(yield func(int64, error) bool) {
		for id := range rows {
			if !yield(id, nil) {
				return
			}
		}
	})
	loader.Get(ctx, 1)
	loader.Get(ctx, 3)

	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewLoaderCollector(loader, metrics.WithConstLabels(prometheus.Labels{"table": "users"})))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	resp, err := http.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		panic(err)
	}
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, "cuckooguard_loader_lookups_total") || strings.HasPrefix(line, "cuckooguard_guard_items") {
			fmt.Print(line)
		}
	}
	// Output:
	// cuckooguard_guard_items{table="users"} 2
	// cuckooguard_loader_lookups_total{result="avoided",table="users"} 1
	// cuckooguard_loader_lookups_total{result="let_through",table="users"} 1
	// cuckooguard_loader_lookups_total{result="negative_cache",table="users"} 0
	// cuckooguard_loader_lookups_total{result="passed_through",table="users"} 0
}
