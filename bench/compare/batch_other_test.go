//go:build !linux

package compare

// adviseRegion reports false: huge pages are asked for on Linux only.
func adviseRegion(region []uint64, huge bool) bool { return false }

// collapseRegion does nothing outside Linux.
func collapseRegion(region []uint64) {}
