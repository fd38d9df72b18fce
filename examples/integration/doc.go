// Package integration runs guarded.Loader against real databases: embedded
// SQLite always, and PostgreSQL when CUCKOOGUARD_PG_DSN holds a postgres://
// URL of a database the tests may create schemas in (.ci/run starts a
// throwaway PostgreSQL 15 cluster and sets it).
package integration
