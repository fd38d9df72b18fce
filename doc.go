// Package cuckooguard keeps slow stores from being asked about keys that
// do not exist. It holds no code: the packages below do the work, and this
// page maps them.
//
// Start with [github.com/cuckooguard/cuckooguard/guarded]: a Loader wraps
// your store's lookup, answers guarded.ErrNotFound for keys its guard has
// never seen without calling the store, shares one store call among
// concurrent lookups of a key, and keeps the guard in step with your
// writes. [github.com/cuckooguard/cuckooguard/middleware] does the same in
// front of an http.Handler.
//
// [github.com/cuckooguard/cuckooguard/guard] is the set itself: cuckoo
// filter shards with lock-free lookups that grow without a wall, with
// snapshots. Use it directly when you keep it in step with the store
// yourself.
//
// [github.com/cuckooguard/cuckooguard/shard] (one cuckoo table) and
// [github.com/cuckooguard/cuckooguard/resize] (when and in the background a
// shard doubles) are the building blocks that guard uses; most programs
// never import them.
//
// Nested modules, each with its own go.mod so that its dependencies stay
// out of the core's:
//
//   - github.com/cuckooguard/cuckooguard/postgres keeps every process's
//     guard in step with a PostgreSQL table (a Follower per process);
//   - github.com/cuckooguard/cuckooguard/metrics exports Prometheus
//     metrics of a guard, a Loader, the middleware and (package pgmetrics)
//     a Follower.
//
// The README has the guarantees, the measurements and the commands.
package cuckooguard
