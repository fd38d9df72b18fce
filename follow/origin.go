package follow

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Origin identifies a database's history: the stream of changes that a
// relay passes on comes from one Origin, and a saved guard, a message or a
// follower's position of another is refused. Two Origins are the same
// database when their Tokens are equal; the Name is for messages only.
type Origin struct {
	// Token is the database's identity as a NATS subject token: letters,
	// digits, "_" and "-", 1 to 64 of them. PostgreSQL's is
	// "<system identifier>_<database oid>".
	Token string
	Name  string // what a message calls it: the database's name and what Token is made of
	// TokenStream is the stream of the consistency tokens its writers
	// get (guarded.Token), where their positions are not the relay's
	// (Commit.Pos) but Commit.Token: MariaDB's, whose writers read a GTID
	// sequence number. "": the tokens' stream is Token, their positions
	// Commit.Pos (PostgreSQL's LSNs).
	TokenStream string
}

// IsZero reports whether o identifies nothing.
func (o Origin) IsZero() bool { return o.Token == "" }

// Same reports whether o and p identify the same database.
func (o Origin) Same(p Origin) bool { return o.Token == p.Token }

// String describes o for a message.
func (o Origin) String() string {
	switch {
	case o.IsZero():
		return "no database"
	case o.Name == "":
		return "database " + o.Token
	}
	return o.Name
}

// CheckToken returns an error if token cannot be an Origin's Token.
func CheckToken(token string) error {
	if token == "" || len(token) > 64 {
		return fmt.Errorf("follow: a database token is 1 to 64 characters, not %d", len(token))
	}
	for i := range len(token) {
		switch c := token[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return fmt.Errorf("follow: database token %q has %q: only letters, digits, '_' and '-'", token, c)
		}
	}
	return nil
}

// TableIdentity is what proves that a name still names the table a stream
// carries: the table's own id (PostgreSQL's oid, 0 if the name resolves to
// no table) and the version of what decides which of its changes the
// stream carries (its publication's; "" if it has none). A rename swap, a
// DROP and CREATE, or a change of the publication changes it.
type TableIdentity struct {
	ID      uint64
	Version string
}

// IsZero reports whether i identifies nothing: a control message of a
// follower that sends no identity.
func (i TableIdentity) IsZero() bool { return i.ID == 0 && i.Version == "" }

// String returns i as "<id> <version>", with "-" for a missing part: the
// form the control messages and the relay's messages carry.
func (i TableIdentity) String() string {
	id, v := "-", "-"
	if i.ID != 0 {
		id = strconv.FormatUint(i.ID, 10)
	}
	if i.Version != "" {
		v = i.Version
	}
	return id + " " + v
}

// ParseTableIdentity is the inverse of [TableIdentity.String].
func ParseTableIdentity(s string) (TableIdentity, error) {
	idText, v, ok := strings.Cut(s, " ")
	if !ok || v == "" {
		return TableIdentity{}, errors.New(`follow: a table identity is "<id> <version>"`)
	}
	var i TableIdentity
	if idText != "-" {
		id, err := strconv.ParseUint(idText, 10, 64)
		if err != nil || id == 0 {
			return TableIdentity{}, fmt.Errorf("follow: table identity %q: bad id", s)
		}
		i.ID = id
	}
	if v != "-" {
		i.Version = v
	}
	return i, nil
}
