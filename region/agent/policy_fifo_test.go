//go:build unix

package agent

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/meridian-quota/meridian/internal/testenv"
)

// A named pipe (or socket, or device) in the policy directory is no policy
// file: LoadPolicy skips it, and the digest the agent polls must not open
// it either, since opening a FIFO for reading blocks until a writer comes.
//
// Fails on f96aee6: digestTree opened every entry that was not a
// directory, so `meridian agent` with a FIFO in RUNTIME_ROOT/…/config hung
// in New before serving or logging anything, and SIGTERM could not stop it
// (its main goroutine sat in open(2)); a FIFO added later froze the Run
// loop at the next poll.
func TestPolicyDigestSkipsAPipe(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors:\n")
	testenv.MustOrSkip(t, syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644), "mkfifo")
	done := make(chan [32]byte, 1)
	go func() { done <- policyDigest(dir) }()
	// The verdict is whether it returns at all; the bound only keeps a
	// regression from hanging the whole test binary.
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("policyDigest blocked opening the FIFO in the policy directory")
	}
}
