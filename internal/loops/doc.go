// Package loops holds the scheduler and the controllers that orch server
// runs as goroutines. They are ordinary API clients with their own
// identity, built on client-go informers and work queues.
package loops
