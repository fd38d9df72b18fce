// Package follow is what every follower of a database's changes shares,
// whatever the database: the states a follower reports ([State]), what it
// keeps in step ([Target]), and the contract between a database's change
// stream and the relay that passes it on to a fleet (package fanout).
//
// A service uses this package only for [State] and [Target]: its
// database's package (postgres, mysql) builds followers, and fanout
// relays them. The rest is for the packages of databases: a database is
// relayed by implementing [Database] — a [Source] of its tables'
// committed changes in commit order, a [Lease] for the relay's
// leadership, and a [Session] through which a relayed follower reads the
// table and sends its heartbeats — and fanout needs nothing else of it.
//
// Positions in a database's history ([Start.Pos], [Commit.Pos]) are
// uint64s that grow with the history: PostgreSQL's LSN, a binlog's file
// and offset. A position that goes back within one [Origin] means the
// database went back to an earlier point (a restore, a reset of its log):
// the relay and its followers read the tables again.
package follow
