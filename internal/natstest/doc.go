// Package natstest runs NATS servers for Meridian's tests: an embedded
// nats-server with JetStream started for one test ([Start]), and the shared
// server of the machine ([Shared]) for the tests that must run against the
// version deployed beside Meridian.
//
// It follows the nats-server test habit: the server runs inside the test
// process on 127.0.0.1 with a random port (Port -1), the helper waits for
// ReadyForConnections, and t.Cleanup shuts it down and waits for its
// goroutines to end, so goleak stays quiet. JetStream keeps its files in
// t.TempDir(), which is what lets [Server.Restart] bring the same server back
// with its streams.
//
// It is imported only by _test.go files; production code never depends on it.
//
// # Missing infrastructure
//
// [Shared] follows internal/testenv's rule: when the shared server cannot be
// reached the test fails if CI is "true" and is skipped loudly anywhere else.
package natstest
