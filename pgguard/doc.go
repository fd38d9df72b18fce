// Package pgguard guards the lookups of a service's PostgreSQL tables on
// every replica, in one call: [Start] makes a guarded.Loader per table,
// publishes the tables, keeps every Loader in step with its table (through
// one relay and NATS JetStream for the whole fleet, or with a follower of
// its own per replica without NATS), and gives the service one readiness
// ([Service.Ready], and [Service] as the http.Handler of /readyz, which
// names the table and the reason when it answers 503) and one
// prometheus.Collector for everything. [Teardown] removes what a service
// made: publications, slots, the relay's messages, consumers and saved
// guards.
//
// It is the packages below it put together the way the README recommends;
// they stay public for those who need another arrangement: guard and
// guarded (the Loader), postgres (Publish, the direct Follower), fanout
// (the Relay and its Follower), and metrics.
//
// Every replica of a service runs the same lines:
//
//	orders := pgguard.Table[int64, Order]{Name: "orders", Column: "id", Get: loadOrder}
//	customers := pgguard.Table[string, Customer]{Name: "customers", Column: "email", Get: loadCustomer}
//	svc, err := pgguard.Start(ctx, pgguard.Config{Pool: pool, NATS: nc, Service: "orders-api"}, &orders, &customers)
//	if err != nil { return err }
//	defer svc.Close()
//	mux.Handle("/readyz", svc)
//	prometheus.MustRegister(svc)
//	order, err := orders.Loader().Get(ctx, id) // guarded.ErrNotFound without a query for an id no row has
//
// A key a client sends may be in any form the database reads as the
// key: the Loader holds the column's key rule ([Table.Key] gives the form
// the guard holds: a citext e-mail in lower case, a uuid in its canonical
// text), and a text the rule cannot judge goes to the store.
//
// Writes go through the table: [Table.Insert], [Table.InsertGenerated]
// and [Table.Delete] run the write in a transaction on the service's pool,
// tag it as this replica's own, and return its consistency token
// (guarded.Token): a lookup on any replica under it (guarded.WithToken,
// the table's [Table.Middleware] reading the Cuckooguard-Token header)
// finds the row at once, where a lookup without it may be up to the
// follower's lag behind. The middleware sets the token on the write's
// response by itself.
package pgguard
