package mysqlguard_test

import (
	"context"
	"database/sql"
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuckooguard/cuckooguard/middleware"
	"github.com/cuckooguard/cuckooguard/mysqlguard"
)

type Order struct{ Customer string }

// A service on MariaDB guards its orders table on every replica: the
// same lines on each, with the replica's own Origin (its pod's name, by
// default) and a directory it keeps across restarts.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app:secret@db:3306/shop") // any MySQL driver
	if err != nil {
		log.Fatal(err)
	}
	orders := &mysqlguard.Table[int64, Order]{Name: "orders", Column: "id",
		Get: func(ctx context.Context, id int64) (Order, error) {
			var o Order
			return o, db.QueryRowContext(ctx, "SELECT customer FROM orders WHERE id = ?", id).Scan(&o.Customer)
		}}
	svc, err := mysqlguard.Start(ctx, mysqlguard.Config{
		DB:          db,
		DSN:         "follower:secret@tcp(db:3306)/shop", // REPLICATION SLAVE, SELECT
		Service:     "orders-api",
		SnapshotDir: "/var/lib/orders-api",
	}, orders)
	if err != nil {
		log.Fatal(err)
	}
	defer svc.Close()
	prometheus.MustRegister(svc)

	byID, err := orders.Middleware(middleware.PathValue("id")) // 404 for an id no row has, before the handler
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/readyz", svc) // 503 naming the table until its follower follows
	mux.Handle("GET /orders/{id}", byID.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := orders.Key(r.PathValue("id"))
		o, err := orders.Loader().Get(r.Context(), id)
		switch {
		case mysqlguard.NotFound(err):
			http.NotFound(w, r)
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		default:
			w.Write([]byte(o.Customer))
		}
	})))
	mux.Handle("PUT /orders/{id}", byID.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := orders.Key(r.PathValue("id"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// The middleware sends the write's token (Cuckooguard-Token) with
		// the response: a read under it finds the order on any replica.
		_, err = orders.Insert(r.Context(), id, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO orders (id, customer) VALUES (?, ?)", id, r.FormValue("customer"))
			return err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})))
	log.Fatal(http.ListenAndServe(":8080", mux))
}
