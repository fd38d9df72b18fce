package pgguard

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(replicaEnv) != "" {
		// This binary runs as the replica process of TestPausedReplica.
		os.Exit(runReplica())
	}
	// The relay saves guards through nats.go's object store, whose Put can
	// leak one goroutine (see fanout's natsPutRace).
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}
