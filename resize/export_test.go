package resize

// withChunk sets how many buckets a worker splits per step, at least 1,
// so that tests can make a migration take many steps. A Resizer always
// uses shard.DefaultChunk (about a microsecond of a writer's wait).
func withChunk(buckets int) Option {
	return func(c *config) { c.chunk = buckets }
}
