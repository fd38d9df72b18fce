// Package mysqlguard guards the lookups of a service's MySQL or MariaDB
// tables on every replica, in one call, as pgguard does for PostgreSQL:
// [Start] makes a guarded.Loader per table, keeps every Loader in step
// with its table from the server's row-based binlog (a mysql.Follower per
// replica and table), and gives the service one readiness
// ([Service.Ready], and [Service] as the http.Handler of /readyz, which
// names the table and the reason when it answers 503) and one
// prometheus.Collector for everything. [Teardown] removes what a service
// made in the database (its heartbeat tables) and, through NATS, the
// relay's place, stream subjects and saved guards.
//
// Without Config.NATS each replica follows each table directly: one
// binlog reader (a replication connection, with a server id of its own:
// [ServerID]) per replica and table. With it, the tables are followed
// through one relay for the whole fleet, as pgguard does: every replica
// campaigns for the relay of the service (fanout.Relay over
// mysql.Relayed; a lease elects one, which reads the binlog once for all
// the tables and publishes their changes to NATS JetStream), and each
// table's fanout.Follower follows the relay's stream. The replica that
// leads saves each table's guard in NATS's object store every
// Config.SnapshotEvery, and a replica that starts later is ready from it
// without reading the table. Through NATS, a write's token (Table.Insert)
// names the binlog's GTID stream, which the relayed followers do not
// report: lookups under it pass through to the store ([Table.Insert]).
//
// It is the packages below it put together the way the README recommends;
// they stay public for those who need another arrangement: guard and
// guarded (the Loader), mysql (the Follower, Relayed, WriteToken), fanout
// (the Relay and its Follower), and metrics (mysqlmetrics, fanoutmetrics).
//
// Every replica of a service runs the same lines:
//
//	orders := mysqlguard.Table[int64, Order]{Name: "orders", Column: "id", Get: loadOrder}
//	users := mysqlguard.Table[string, User]{Name: "users", Column: "email", Get: loadUser}
//	svc, err := mysqlguard.Start(ctx, mysqlguard.Config{DB: db, DSN: dsn, Service: "orders-api",
//		SnapshotDir: "/var/lib/orders-api"}, &orders, &users)
//	if err != nil { return err }
//	defer svc.Close()
//	mux.Handle("/readyz", svc)
//	prometheus.MustRegister(svc)
//	order, err := orders.Loader().Get(ctx, id) // guarded.ErrNotFound without a query for an id no row has
//
// The server needs log_bin, binlog_format=ROW and binlog_row_image=FULL,
// and gtid_strict_mode=ON for consistency tokens; the followers' user
// needs REPLICATION SLAVE and SELECT (the mysql package doc's "Setup").
// The followers check the server and each table when they start, and a
// setup that cannot work is named on /readyz.
//
// A key a client sends may be in any form the column reads as the key: a
// utf8mb4_general_ci e-mail in any case, an integer with leading zeros.
// The follower installs the column's rule in the Loader (the mysql
// package doc's "Key equality"), and a text the rule cannot judge goes to
// the store. A column whose equality the guard cannot hold (a
// utf8mb4_unicode_ci text, a float) is refused: /readyz names it, with
// what to change.
//
// Writes go through the table: [Table.Insert], [Table.InsertGenerated]
// and [Table.Delete] run the write in a transaction on the service's pool,
// tag it as this replica's own, and return its consistency token
// (guarded.Token, from mysql.WriteToken): a lookup on any replica under it
// (guarded.WithToken, the table's [Table.Middleware] reading the
// Cuckooguard-Token header) finds the row at once (through NATS by
// asking the store), where a lookup without it may be up to the
// follower's lag behind. The middleware sets the token
// on the write's response by itself. A server without gtid_strict_mode
// gives no token: the writes return the zero token, and lookups are
// answered as if the client had not written.
//
// With Config.SnapshotDir each table's follower saves its guard there,
// with the binlog position it reflects, every minute while the position
// moves and when the Service closes: a restarted replica restores it and
// streams on from that position, without reading the table, once the
// server's binlog proves the position (the mysql package doc's
// "Restarting from a saved guard").
package mysqlguard
