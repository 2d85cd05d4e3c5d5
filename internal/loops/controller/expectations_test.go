package controller

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestExpectations: an owner is satisfied once every create and delete it
// issued has been seen, or once they are five minutes old (a lost watch
// event must not stop the owner for good).
func TestExpectations(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	e := NewExpectations(clk)
	if !e.Satisfied("default/web") {
		t.Fatal("an owner that issued nothing waits")
	}
	e.Raise("default/web", "")
	e.Raise("default/web", "pod-a")
	e.Raise("default/web", "pod-a") // a delete is counted once however often raised
	if e.Satisfied("default/web") {
		t.Fatal("satisfied before anything was seen")
	}
	e.Created("default/web")
	e.Deleted("default/web", "pod-b") // not one it waits for
	if e.Satisfied("default/web") {
		t.Fatal("satisfied with pod-a's delete unseen")
	}
	e.Deleted("default/web", "pod-a")
	if !e.Satisfied("default/web") {
		t.Fatal("not satisfied once the create and the delete were seen")
	}
	e.Expect("default/db", 2, nil)
	e.Created("default/db")
	if e.Satisfied("default/db") {
		t.Fatal("satisfied with one of two creates seen")
	}
	clk.SetTime(clk.Now().Add(expectationsTimeout + time.Second))
	if !e.Satisfied("default/db") {
		t.Fatal("still waiting after the timeout")
	}
	e.Forget("default/db")
	if !e.Satisfied("default/db") {
		t.Fatal("a forgotten owner waits")
	}
}
