package tagrec

// Split splits the content of a tag (what a follower's Tag writes, as a
// follow.Commit's Tags carry it) into pieces of at most size bytes each,
// at the boundaries of its records, so that a relay can pass a tag of
// many keys on in messages of a limited size: the pieces, read as the tags
// of one transaction, name the same keys. A record larger than size is a
// piece of its own, and a tail that does not read as records is the last
// piece.
func Split(tag []byte, size int) [][]byte {
	if len(tag) <= size {
		return [][]byte{tag}
	}
	var pieces [][]byte
	start, end := 0, 0 // the piece being made is tag[start:end]
	rest := string(tag)
	for rest != "" {
		_, after, ok := CutField(rest)
		if ok {
			_, after, ok = CutField(after)
		}
		if !ok {
			break
		}
		next := end + len(rest) - len(after) // the end of this record
		if next-start > size && end > start {
			pieces = append(pieces, tag[start:end])
			start = end
		}
		end = next
		rest = after
	}
	if end > start {
		pieces = append(pieces, tag[start:end])
	}
	if end < len(tag) {
		pieces = append(pieces, tag[end:])
	}
	return pieces
}
