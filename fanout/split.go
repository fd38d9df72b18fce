package fanout

import (
	"encoding/json"
	"math"

	"github.com/cuckooguard/cuckooguard/internal/tagrec"
)

// split returns the parts of transaction m (Creates, Deletes and Tags
// set), each of which encodes to at most limit bytes: keys and tags are
// counted as JSON writes them (a key of "<" takes 8 bytes, "\u003c" and
// its quotes; a tag in base64). Keys come first, then the tags. A key or
// tag that cannot fit in a part of its own is left out, and the last part
// says Reread: its readers read the table (nothing the database can commit
// wedges the relay). Only the last part carries Reread.
func split(m txMsg, limit int) []txMsg {
	// What a part takes besides its keys and tags, at most: its fields
	// with the largest part numbers, and the keys' and tags' brackets.
	env := m
	env.Creates, env.Deletes, env.Tags = []string{""}, []string{""}, [][]byte{{}}
	env.Part, env.Parts, env.Reread = math.MaxInt32, math.MaxInt32, true
	b, _ := env.encode() // a txMsg always encodes
	budget := limit - len(b)
	keySize := func(k string) int {
		b, _ := json.Marshal(k) // a string always encodes
		return len(b) + 1       // and a comma
	}
	tagSize := func(t []byte) int { return (len(t)+2)/3*4 + 3 }
	var parts []txMsg
	head := txMsg{Epoch: m.Epoch, Term: m.Term, DB: m.DB, LSN: m.LSN, Prev: m.Prev, Xid: m.Xid, Tok: m.Tok, Version: m.Version}
	cur := head
	n := 0
	dropped := false
	room := func(size int) bool {
		if size > budget {
			dropped = true
			return false
		}
		if n+size > budget {
			parts = append(parts, cur)
			cur = head
			n = 0
		}
		n += size
		return true
	}
	for _, k := range m.Creates {
		if room(keySize(k)) {
			cur.Creates = append(cur.Creates, k)
		}
	}
	for _, k := range m.Deletes {
		if room(keySize(k)) {
			cur.Deletes = append(cur.Deletes, k)
		}
	}
	for _, tag := range m.Tags {
		// A tag of many keys goes in pieces of whole records, each of
		// which a part can hold.
		for _, t := range tagrec.Split(tag, max(budget/4*3-3, 1)) {
			if room(tagSize(t)) {
				cur.Tags = append(cur.Tags, t)
			}
		}
	}
	parts = append(parts, cur)
	if len(parts) > 1 {
		for i := range parts {
			parts[i].Part, parts[i].Parts = i, len(parts)
		}
	}
	parts[len(parts)-1].Reread = m.Reread || dropped
	return parts
}
