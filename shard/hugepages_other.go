//go:build !linux

package shard

// adviseHugePages does nothing: huge pages are advised on Linux only.
func adviseHugePages(b []uint64, collapse bool) {}
