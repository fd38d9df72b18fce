package mysqlguard

import (
	"testing"

	"go.uber.org/goleak"
)

// natsPutLeak is the goroutine that nats.go's object store Put can leave
// behind (see fanout's natsPutRace): the relay's replica saves guards
// through it.
var natsPutLeak = goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, natsPutLeak) }
