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
	goleak.VerifyTestMain(m)
}
