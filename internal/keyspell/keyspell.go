// Package keyspell holds spellings of the key types of the README's table
// ("Key types"): for each type, groups of texts that PostgreSQL reads as one
// key (case, padding, scale, exponents, time zones, units, address forms,
// braces), each group written to the table in its first form. The postgres
// module's TestKeyTypesDirect follows a table of each type and looks every
// spelling up through the Loader; examples/integration's
// TestKeyTypeSpellingsThroughFronts sends them through the HTTP middleware
// and rpcguard. The database judges each spelling: a test sends only those
// whose row it finds, and never trusts a group without asking.
package keyspell

// Type is one key type: the groups of texts that are one key to the
// database, each written in its first form.
type Type struct {
	Name, Type string     // Type as the table's key column is declared
	Setup      []string   // statements before the table; "citext": the extension, in schema public
	Seed       [][]string // written before the follower starts: read
	Later      [][]string // written while it follows: streamed
	Own        [][]string // inserted through the Loader in the first form, tagged (another client may write them instead)
	Lookup     string     // a lookup's condition, if not "k = $1" (a domain over an enum has no =)
}

// Types returns the types of issue 40, with the examples. Each
// call returns new slices: a caller may change them.
func Types() []Type {
	return []Type{
		{Name: "character(5)", Type: "character(5)",
			Seed:  [][]string{{"ab", "ab   ", "ab "}, {"cde  ", "cde"}, {"f", "f    ", "f        "}},
			Later: [][]string{{"gh", "gh   "}, {"ijk ", "ijk"}, {"l", "l  "}},
			Own:   [][]string{{"mn", "mn   "}}},
		{Name: "citext", Type: "public.citext", Setup: []string{"citext"},
			Seed:  [][]string{{"Alice@Example.com", "alice@example.com", "ALICE@EXAMPLE.COM", "aLiCe@eXaMpLe.CoM"}, {"Émile@Exemple.fr", "émile@exemple.fr", "ÉMILE@EXEMPLE.FR"}, {"ΣΑΣ@example.gr", "σασ@example.gr"}},
			Later: [][]string{{"Bob@Example.com", "bob@example.com", "BOB@example.COM"}, {"ДЯДЯ@example.ru", "дядя@example.ru"}, {"Straße@Example.de", "straße@example.de", "STRAßE@EXAMPLE.DE"}},
			Own:   [][]string{{"Carol@Example.com", "carol@example.com", "CAROL@EXAMPLE.COM"}}},
		{Name: "numeric", Type: "numeric",
			Seed:  [][]string{{"1.50", "1.5", "1.500", "15e-1", "+1.5"}, {"4.0", "4", "4.00", "04"}, {"-0.00", "0", "-0", "0e5"}, {"NaN", "nan", "NAN"}},
			Later: [][]string{{"2.50", "2.5", "25e-1"}, {"100", "1e2", "100.000", "1E+2"}, {"-3.10", "-3.1"}},
			Own:   [][]string{{"7.70", "7.7"}}},
		{Name: "numeric(10,2)", Type: "numeric(10,2)",
			Seed:  [][]string{{"1.5", "1.50", "1.500"}, {"4", "4.0"}},
			Later: [][]string{{"2.25", "2.250"}}},
		{Name: "double precision", Type: "double precision",
			Seed:  [][]string{{"0.1", "0.10", "1e-1", "1.0e-1"}, {"-0", "0", "0.0", "-0.0"}, {"NaN", "nan"}, {"Infinity", "inf", "+Infinity"}},
			Later: [][]string{{"1.5", "1.50", "15e-1"}, {"-1e300", "-1.0e300"}, {"0.30000000000000004", "3.0000000000000004e-1"}},
			Own:   [][]string{{"2.5", "2.50"}}},
		{Name: "real", Type: "real",
			Seed:  [][]string{{"0.1", "0.10", "1e-1"}, {"-0", "0"}, {"NaN", "nan"}},
			Later: [][]string{{"1.5", "1.50"}, {"3.4e38", "3.40e38"}}},
		{Name: "timestamptz", Type: "timestamp with time zone",
			Seed: [][]string{{"2026-01-02 03:04:05+00", "2026-01-02T05:04:05+02:00", "2026-01-02 03:04:05Z", "2026-01-01 22:04:05-05", "2026-01-02 08:34:05+0530"},
				{"2026-06-30 12:00:00.5+05:30", "2026-06-30 06:30:00.500Z", "2026-06-30T06:30:00.5+00:00"}, {"0044-03-15 10:00:00+00 BC", "0044-03-15 12:00:00+02 BC"}},
			Later: [][]string{{"2027-02-03 04:05:06-08", "2027-02-03 12:05:06+00", "2027-02-03T12:05:06Z"}, {"infinity", "Infinity"}},
			Own:   [][]string{{"2028-01-01 00:00:00+00", "2028-01-01T01:00:00+01:00"}}},
		{Name: "timestamp", Type: "timestamp",
			Seed:  [][]string{{"2026-01-02 03:04:05", "2026-01-02T03:04:05", "2026-01-02 03:04:05.000"}, {"2026-01-02 03:04:05.25", "2026-01-02 03:04:05.250000"}},
			Later: [][]string{{"2027-02-03 04:05:06", "2027-02-03T04:05:06.0"}, {"2027-02-03", "2027-02-03 00:00", "2027-02-03 00:00:00"}}},
		{Name: "date", Type: "date",
			Seed:  [][]string{{"2026-01-02", "2026-1-2"}, {"0044-03-15 BC"}},
			Later: [][]string{{"2027-02-03", "2027-2-3"}, {"infinity"}}},
		{Name: "interval", Type: "interval",
			Seed:  [][]string{{"1 mon", "30 days", "720:00:00", "720 hours"}, {"1 day", "24:00:00", "24 hours", "1440 minutes"}},
			Later: [][]string{{"1 year", "12 mons", "360 days"}, {"-1 days +02:00:00", "-22:00:00", "-22 hours"}, {"90 minutes", "01:30:00", "01:30", "5400 seconds"}}},
		{Name: "inet", Type: "inet",
			Seed:  [][]string{{"10.0.0.1", "10.0.0.1/32"}, {"10.1.0.0/16"}, {"FE80::1", "fe80::1", "fe80:0:0:0:0:0:0:1", "FE80:0000::0001"}},
			Later: [][]string{{"192.168.1.1/32", "192.168.1.1"}, {"::ffff:1.2.3.4", "::FFFF:1.2.3.4", "::ffff:102:304"}, {"2001:DB8::/32", "2001:db8::/32"}}},
		{Name: "cidr", Type: "cidr",
			Seed:  [][]string{{"10.0.0.0/8"}, {"192.168.1.7", "192.168.1.7/32"}},
			Later: [][]string{{"2001:DB8::/32", "2001:db8::/32", "2001:0db8:0000::/32"}}},
		{Name: "bytea", Type: "bytea",
			Seed:  [][]string{{`\x0102FF`, `\x0102ff`, `\x01 02 ff`, `\001\002\377`}, {`abc`, `\x616263`}},
			Later: [][]string{{`\xDEADBEEF`, `\xdeadbeef`}, {`a\\b`, `\x615c62`}}},
		{Name: "uuid", Type: "uuid",
			Seed:  [][]string{{"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}", "a0eebc999c0b4ef8bb6d6bb9bd380a11"}},
			Later: [][]string{{"B1FFCD00-0000-4000-8000-000000000001", "b1ffcd00000040008000000000000001", "b1ff-cd00-0000-4000-8000-0000-0000-0001"}},
			Own:   [][]string{{"C2000000-0000-4000-8000-000000000002", "c2000000-0000-4000-8000-000000000002"}}},
		{Name: "bigint", Type: "bigint",
			Seed:  [][]string{{"7", "007", "+7"}, {"-42", "-042"}},
			Later: [][]string{{"0", "-0", "+0", "000"}, {"9223372036854775807"}},
			Own:   [][]string{{"8", "08"}}},
		{Name: "text", Type: "text",
			Seed:  [][]string{{"Alice@Example.com"}, {"alice@example.com"}, {"ab  "}},
			Later: [][]string{{"Bob"}, {"bob"}, {"émile"}}},
		{Name: "enum", Type: "mood", Setup: []string{`CREATE TYPE mood AS ENUM ('happy', 'Sad', 'ok now')`},
			Seed:  [][]string{{"happy"}, {"Sad"}},
			Later: [][]string{{"ok now"}}, Lookup: "k::mood = $1::mood"},
	}
}
