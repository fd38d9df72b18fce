package fanout

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cuckooguard/cuckooguard/postgres"
)

// TestTeardown runs a relayed service of two tables whose followers save
// their guards, stops it, and tears it down through a pool: no slot,
// publication, stream, bucket or consumer is left.
func TestTeardown(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.table(t, "orders", 100)
	e.table(t, "customers", 100)
	_, stopRelay := e.startRelay(t, "r_teardown", "orders", "customers")
	var nodes []*node
	for _, table := range []string{"orders", "customers"} {
		nodes = append(nodes, e.startNode(t, "a-"+table, table, WithSnapshots(e.bucket(), 50*time.Millisecond, func() bool { return true })))
	}
	for deadline := time.Now().Add(10 * time.Second); nodes[0].f.Stats().SnapshotsSaved == 0 || nodes[1].f.Stats().SnapshotsSaved == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no guard saved")
		}
	}
	pool, err := pgxpool.New(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// The slot tools see the relay's slot, beside each of its tables.
	for _, table := range []string{"orders", "customers"} {
		slots, err := postgres.Slots(ctx, pool, table)
		if err != nil {
			t.Fatal(err)
		}
		if len(slots) != 1 || !slots[0].Relay || slots[0].Name != postgres.SlotName("r_teardown") || slots[0].Origin != "r_teardown" {
			t.Errorf("Slots(%s) = %+v, want the relay's", table, slots)
		}
	}
	for _, n := range nodes {
		n.stop()
	}
	stopRelay()
	if err := Teardown(ctx, relayed(t, e.dsn), e.nc, "r_teardown", []string{"orders", "customers"}, e.opts...); err != nil {
		t.Fatal(err)
	}
	var slots, pubs int
	pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, postgres.SlotName("r_teardown")).Scan(&slots)
	for _, table := range []string{"orders", "customers"} {
		s, err := postgres.Slots(ctx, pool, table)
		if err != nil {
			t.Fatal(err)
		}
		slots += len(s)
	}
	pool.QueryRow(ctx, `SELECT count(*) FROM pg_publication_tables WHERE schemaname = current_schema()`).Scan(&pubs)
	js := e.jsOf(t)
	_, streamErr := js.Stream(ctx, "CG_"+e.id)
	_, bucketErr := js.ObjectStore(ctx, e.bucket())
	t.Logf("after teardown: %d slots, %d publications, stream: %v, bucket: %v", slots, pubs, streamErr, bucketErr)
	if slots != 0 || pubs != 0 || !errors.Is(streamErr, jetstream.ErrStreamNotFound) || !errors.Is(bucketErr, jetstream.ErrBucketNotFound) {
		t.Errorf("teardown left %d slots, %d published tables, stream: %v, bucket: %v", slots, pubs, streamErr, bucketErr)
	}
	var reg bool
	pool.QueryRow(ctx, `SELECT to_regclass('cuckooguard_slots') IS NOT NULL`).Scan(&reg)
	if reg {
		t.Error("cuckooguard_slots is left")
	}
}
