package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The tests in this file check the decoder's and the Tagger's use of a
// key column's forms; all but the last need no server.

// TestDecoderCanonicalKeys: the decoder passes on each key in its
// column's canonical form, creations and deletions alike, so that the
// follower and a relay's readers hold one form per key; a key the server
// printed in a form the rule does not read fails the session.
func TestDecoderCanonicalKeys(t *testing.T) {
	table := users("app")
	table.rule = &keyRule{typ: "character(5)", server: canonBpchar}
	d := newDecoder(table)
	r := &recorder{}
	feed(t, d, r,
		relationMsg(7, "app", "users", "name", "id"),
		begin(1), insertMsg(7, "ab   "), updateMsg(7, "cd   ", "ef   "), deleteMsg(7, "g    "), commit(0x100))
	tx := r.txns[0]
	if got, want := join(tx.tables[0].creates)+"/"+join(tx.tables[0].deletes), "ab,ef/cd,g"; got != want {
		t.Fatalf("creates/deletes = %q, want %q", got, want)
	}
	table.rule = &keyRule{typ: "numeric", server: canonNumeric}
	d = newDecoder(table)
	feed(t, d, r, relationMsg(7, "app", "users", "name", "id"), begin(2))
	if err := d.decode(insertMsg(7, "1.2.3"), r); err == nil || !strings.Contains(err.Error(), "cannot read") {
		t.Fatalf("a key the rule cannot read = %v, want an error", err)
	}
}

// TestTaggerKeyForms: Key gives the canonical form and parses it; Tag
// refuses a key in another form once the column's forms are known, and
// before that Key says it does not know.
func TestTaggerKeyForms(t *testing.T) {
	tags, err := newTagger("A", parseText, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tags.Key("Ab"); !errors.Is(err, ErrKeyUnknown) {
		t.Fatalf("Key without a column = %v, want ErrKeyUnknown", err)
	}
	if _, _, err := tags.Query("Ab"); err != nil {
		t.Fatalf("Tag before the forms are known = %v, want no error", err)
	}
	tags.setRule(&keyRule{typ: "numeric", canon: canonNumeric, server: canonNumeric})
	if k, err := tags.Key("1.50"); err != nil || k != "1.5" {
		t.Fatalf(`Key("1.50") = %q, %v; want "1.5"`, k, err)
	}
	if _, err := tags.Key("1.2.3"); err == nil {
		t.Fatal(`Key("1.2.3") gave a key; want an error: the store decides`)
	}
	if _, _, err := tags.Query("1.50"); err == nil || !strings.Contains(err.Error(), `canonical form is "1.5"`) {
		t.Fatalf("Tag of a key in another form = %v, want an error naming its canonical form", err)
	}
	if _, _, err := tags.Query("1.5"); err != nil {
		t.Fatalf("Tag of a canonical key = %v", err)
	}
}

// TestTaggerReadColumn: a Tagger whose UseColumn could not reach the
// database knows its column's forms once a session reads them through its
// own connection.
func TestTaggerReadColumn(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	dsn := dsnOf(t, db)
	execAll(t, dsn, `CREATE TABLE amounts (k numeric PRIMARY KEY)`)
	tags, err := newTagger("A", parseText, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tags.ReadColumn(ctx, db); err == nil {
		t.Fatal("ReadColumn without UseColumn gave no error")
	}
	nowhere, err := pgx.ParseConfig("postgres://nobody@127.0.0.1:1/none?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	if err := tags.UseColumn(nowhere, "amounts", "k", 100*time.Millisecond); err != nil {
		t.Fatalf("UseColumn without a database = %v, want no error", err)
	}
	if _, err := tags.Key("1.50"); !errors.Is(err, ErrKeyUnknown) {
		t.Fatalf("Key before the forms are read = %v, want ErrKeyUnknown", err)
	}
	if err := tags.ReadColumn(ctx, db); err != nil {
		t.Fatal(err)
	}
	if k, err := tags.Key("1.50"); err != nil || k != "1.5" {
		t.Fatalf(`Key("1.50") after ReadColumn = %q, %v; want "1.5"`, k, err)
	}
}
