// Package release is what an upgrade of orch moves, and how a machine
// takes it: what a release binary is (Inspect, Verify), where a server
// keeps the binaries it hands its nodes (Store), which version may follow
// which (CheckSkew), and how a machine replaces its own binary with a way
// back (Install, Trial, Guard).
//
// A machine's upgrade is a trial until the node is Ready on the new
// binary: the binary it replaced stays beside it (NAME.previous), a trial
// file in the data dir names both, and a guard process running the
// previous binary's code puts it back and starts it when the new one dies
// or is not Ready by the deadline: a binary that cannot start at all is
// rolled back by code that can.
package release
