// Package testenv provides the environment helpers that Meridian's tests share:
// a connection to the shared Redis; private redis-server processes started
// for one test — plain, with a password (requirepass) or TLS only
// ([StartRedisWith], certificates from [NewPKI]), Redis Clusters
// ([StartCluster]) and a Sentinel with a master and a replica
// ([StartSentinel]); and unique key prefixes with cleanup.
//
// It is imported only by _test.go files; production code never depends on it
// (internal/archtest enforces this).
//
// # Missing infrastructure
//
// A test that needs Redis fails when the environment variable CI is "true"
// and Redis (or the redis-server / redis-cli binaries) cannot be had; anywhere
// else it is skipped with a loud "SKIP:" message. [MustOrSkip] implements the
// rule and every helper here follows it.
//
// # Waiting and cleanup
//
// Helpers wait for a server by polling it with a deadline, never with a fixed
// sleep. Everything a helper starts or opens is stopped or closed through
// t.Cleanup, so cleanups run in reverse order of the calls that registered
// them: call [Cleanup] after obtaining the client it uses.
//
// All helpers take a testing.TB and call t.Helper. They may be called from
// parallel tests; each call works on its own servers, clients and prefixes.
package testenv
