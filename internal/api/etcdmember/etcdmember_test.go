package etcdmember_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/internal/api/etcdmember"
	"github.com/orch-dev/orch/internal/porttest"
)

func TestPromotionsKeepVotersOdd(t *testing.T) {
	for _, tc := range []struct{ voters, learners, want int }{
		{1, 0, 0},
		{1, 1, 0}, // two voters would halt on either's failure: wait for a third
		{1, 2, 2},
		{3, 1, 0},
		{3, 2, 2},
		{2, 1, 1}, // a cluster left with two voters takes the learner
		{2, 0, 0},
		{1, 3, 2},
	} {
		if got := etcdmember.PromotionsFor(tc.voters, tc.learners); got != tc.want {
			t.Errorf("PromotionsFor(%d voters, %d learners) = %d, want %d", tc.voters, tc.learners, got, tc.want)
		}
	}
}

func memberConfig(t *testing.T, name, tlsDir string) etcdmember.Config {
	dir := t.TempDir()
	return etcdmember.Config{Dir: filepath.Join(dir, "db", "etcd"), TLSDir: tlsDir, NodeName: name, IP: net.IPv4(127, 0, 0, 1),
		ClientPort: porttest.Free(t), PeerPort: porttest.Free(t), LogLevel: "panic"}
}

// copyCAs gives a joining server etcd's CAs, as the cluster's bootstrap
// data does.
func copyCAs(t *testing.T, from, to string) {
	t.Helper()
	for _, f := range etcdmember.CAFiles {
		b, err := os.ReadFile(filepath.Join(from, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(to, f)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func voters(t *testing.T, c *clientv3.Client) (int, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, l, err := etcdmember.CountMembers(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	return v, l
}

// newCluster makes etcd's CAs for a new cluster, as the first server does.
func newCluster(t *testing.T) (tlsDir string, certs *etcdmember.Certificates) {
	t.Helper()
	tlsDir = filepath.Join(t.TempDir(), "tls")
	certs, err := etcdmember.LoadCertificates(tlsDir, true)
	if err != nil {
		t.Fatal(err)
	}
	return tlsDir, certs
}

// clientOf is a client of the member, closed when the test ends.
func clientOf(t *testing.T, m *etcdmember.Member, cfg *tls.Config) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL()}, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func eventually(t *testing.T, what string, within time.Duration, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestThreeMembers: a cluster made by one member takes two more as
// learners; the second waits unpromoted until the third joins, then both
// vote, and the cluster keeps its data and its quorum when one stops.
func TestThreeMembers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three etcd members")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	firstTLS, certs := newCluster(t)
	firstCfg := memberConfig(t, "first", firstTLS)
	first, err := etcdmember.StartNew(ctx, firstCfg, certs)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	go first.ManageLearners(ctx, 200*time.Millisecond)

	tlsCfg, err := first.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	client := clientOf(t, first, tlsCfg)
	if _, err := client.Put(ctx, "/before", "joins"); err != nil {
		t.Fatal(err)
	}

	var thirdCfg etcdmember.Config
	var thirdCerts *etcdmember.Certificates
	join := func(name string) *etcdmember.Member {
		tlsDir := filepath.Join(t.TempDir(), "tls")
		copyCAs(t, firstTLS, tlsDir)
		certs, err := etcdmember.LoadCertificates(tlsDir, false)
		if err != nil {
			t.Fatal(err)
		}
		cfg := memberConfig(t, name, tlsDir)
		thirdCfg, thirdCerts = cfg, certs
		m, err := etcdmember.Join(ctx, cfg, certs, []string{first.ClientURL()})
		if err != nil {
			t.Fatalf("join %s: %v", name, err)
		}
		t.Cleanup(m.Close)
		go m.ManageLearners(ctx, 200*time.Millisecond)
		return m
	}
	second := join("second")
	time.Sleep(2 * time.Second) // rounds of promotion pass
	if v, l := voters(t, client); v != 1 || l != 1 {
		t.Fatalf("after the second joined: %d voters, %d learners; want 1 and 1 (two voters are refused)", v, l)
	}
	if !second.IsLearner() {
		t.Fatal("the second member votes with one other")
	}
	third := join("third")
	eventually(t, "three voters", time.Minute, func() bool { v, l := voters(t, client); return v == 3 && l == 0 })

	// The third has what was written before it joined, and what is
	// written through it reaches the others.
	tc := clientOf(t, third, tlsCfg)
	if resp, err := tc.Get(ctx, "/before"); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read through the third: %v %v", resp, err)
	}
	// The first stops: two of three keep the quorum.
	first.Close()
	var putErr error
	eventually(t, "a write with the first member gone", 30*time.Second, func() bool {
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		defer wcancel()
		_, putErr = tc.Put(wctx, "/after", fmt.Sprint(time.Now().UnixNano()))
		return putErr == nil
	})
	// The second, a voter now, names the two members left as voters.
	if got := second.VoterClientURLs(); len(got) != 3 || got[0] != second.ClientURL() {
		t.Errorf("the second's voters: %v, want three, its own first", got)
	}

	// The second goes too: the third alone has no quorum, until it is
	// reset to a cluster of one with its data (--cluster-reset).
	second.Close()
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = tc.Put(wctx, "/lost", "quorum")
	wcancel()
	if err == nil {
		t.Fatal("one member of three took a write")
	}
	third.Close()
	thirdCfg.ForceNewCluster = true
	reset, err := etcdmember.StartNew(ctx, thirdCfg, thirdCerts)
	if err != nil {
		t.Fatalf("reset: %v", err)
	}
	defer reset.Close()
	rc := clientOf(t, reset, tlsCfg)
	if _, err := rc.Put(ctx, "/after-reset", "x"); err != nil {
		t.Fatalf("write after the reset: %v", err)
	}
	if resp, err := rc.Get(ctx, "/after"); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the reset member lost its data: %v %v", resp, err)
	}
	if v, l := voters(t, rc); v != 1 || l != 0 {
		t.Fatalf("after the reset: %d voters, %d learners; want the one", v, l)
	}
}

// TestRestore: a snapshot restored is a cluster of one with the snapshot's
// data and not what came after, at a revision a billion ahead. A stopped
// member's own file makes a snapshot that restores too.
func TestRestore(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd member")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tlsDir, certs := newCluster(t)
	cfg := memberConfig(t, "only", tlsDir)
	m, err := etcdmember.StartNew(ctx, cfg, certs)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := m.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	c := clientOf(t, m, tlsCfg)
	if _, err := c.Put(ctx, "/kept", "v"); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(t.TempDir(), "snap.db")
	rd, err := c.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(snap)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, rd); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if _, err := c.Put(ctx, "/later", "v"); err != nil {
		t.Fatal(err)
	}
	if _, err := etcdmember.SnapshotFile(cfg.Dir, io.Discard); err == nil || !strings.Contains(err.Error(), "running") {
		t.Errorf("a snapshot of a running member's file: %v, want it refused", err)
	}
	_ = c.Close()
	m.Close()
	// The member stopped, its own file is the snapshot (orch snapshot
	// save with no server running).
	stopped := filepath.Join(t.TempDir(), "stopped.db")
	f, err = os.Create(stopped)
	if err != nil {
		t.Fatal(err)
	}
	stoppedRev, err := etcdmember.SnapshotFile(cfg.Dir, f)
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if !etcdmember.IsSnapshot(snap) || !etcdmember.IsSnapshot(stopped) {
		t.Error("etcd's snapshots are not told apart as such")
	}
	other := filepath.Join(t.TempDir(), "other.db")
	db, err := bolt.Open(other, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("objects")); return err })
	_ = db.Close()
	if etcdmember.IsSnapshot(other) || etcdmember.IsSnapshot(filepath.Join(t.TempDir(), "missing")) {
		t.Error("a bbolt file of another kind, or no file, taken for etcd's snapshot")
	}

	restored := restoreAndStart(ctx, t, cfg, certs, snap)
	defer restored.Close()
	rc := clientOf(t, restored, tlsCfg)
	kept, err := rc.Get(ctx, "/kept")
	if err != nil || len(kept.Kvs) != 1 {
		t.Fatalf("/kept after the restore: %v %v", kept, err)
	}
	if later, err := rc.Get(ctx, "/later"); err != nil || len(later.Kvs) != 0 {
		t.Fatalf("/later, written after the snapshot, is there: %v %v", later, err)
	}
	if kept.Header.Revision < 1_000_000_000 {
		t.Errorf("revision after the restore: %d, want a billion ahead", kept.Header.Revision)
	}
	old, _ := filepath.Glob(cfg.Dir + "-old-*")
	if len(old) != 1 {
		t.Errorf("the data before the restore was not kept aside: %v", old)
	}
	_ = rc.Close()
	restored.Close()

	// The stopped member's snapshot restores too (its hash checked), with
	// what was written last.
	again := restoreAndStart(ctx, t, cfg, certs, stopped)
	defer again.Close()
	later, err := clientOf(t, again, tlsCfg).Get(ctx, "/later")
	if err != nil || len(later.Kvs) != 1 {
		t.Fatalf("/later after restoring the stopped member's snapshot: %v %v", later, err)
	}
	if later.Kvs[0].ModRevision != stoppedRev {
		t.Errorf("the snapshot said revision %d; /later, written last, has %d", stoppedRev, later.Kvs[0].ModRevision)
	}
}

// restoreAndStart restores a snapshot as the member of cfg and starts it.
func restoreAndStart(ctx context.Context, t *testing.T, cfg etcdmember.Config, certs *etcdmember.Certificates, snapshot string) *etcdmember.Member {
	t.Helper()
	if err := etcdmember.Restore(cfg, snapshot); err != nil {
		t.Fatal(err)
	}
	m, err := etcdmember.StartNew(ctx, cfg, certs)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestClientNeedsEtcdsCA: etcd takes only clients with a certificate from
// its own CA.
func TestClientNeedsEtcdsCA(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd member")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tlsDir, certs := newCluster(t)
	m, err := etcdmember.StartNew(ctx, memberConfig(t, "only", tlsDir), certs)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	other, err := etcdmember.LoadCertificates(filepath.Join(t.TempDir(), "tls"), true)
	if err != nil {
		t.Fatal(err)
	}
	otherTLS, err := other.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	mine, err := m.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	// Trusting etcd, but with another CA's client certificate.
	otherTLS.RootCAs = mine.RootCAs
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL()}, TLS: otherTLS, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	gctx, gcancel := context.WithTimeout(ctx, 3*time.Second)
	defer gcancel()
	if _, err := c.Get(gctx, "/x"); err == nil {
		t.Fatal("etcd served a client whose certificate another CA signed")
	}
	if _, err := etcdmember.LoadCertificates(filepath.Join(t.TempDir(), "none"), false); err == nil {
		t.Fatal("a joining server made etcd CAs of its own")
	}
}

// TestConcurrentJoins: two servers started together both join (the one
// added second changes the membership the first starts with), and both
// vote.
func TestConcurrentJoins(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three etcd members")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	firstTLS, certs := newCluster(t)
	first, err := etcdmember.StartNew(ctx, memberConfig(t, "first", firstTLS), certs)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	go first.ManageLearners(ctx, 200*time.Millisecond)
	errs := make(chan error, 2)
	for _, name := range []string{"second", "third"} {
		tlsDir := filepath.Join(t.TempDir(), "tls")
		copyCAs(t, firstTLS, tlsDir)
		certs, err := etcdmember.LoadCertificates(tlsDir, false)
		if err != nil {
			t.Fatal(err)
		}
		cfg := memberConfig(t, name, tlsDir)
		go func() {
			m, err := etcdmember.Join(ctx, cfg, certs, []string{first.ClientURL()})
			if err == nil {
				t.Cleanup(m.Close)
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("a join: %v", err)
		}
	}
	tlsCfg, err := first.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	client := clientOf(t, first, tlsCfg)
	eventually(t, "three voters", time.Minute, func() bool { v, l := voters(t, client); return v == 3 && l == 0 })
}

// TestStalledLearnerRemoved: a member added as a learner whose server
// never starts (it died while joining) is removed by the leader once past
// the deadline, freeing its place; a learner that waits on purpose (two
// voters would be less available than one) stays.
func TestStalledLearnerRemoved(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd members")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	firstTLS, certs := newCluster(t)
	cfg := memberConfig(t, "first", firstTLS)
	cfg.StalledLearnerAfter = time.Second
	first, err := etcdmember.StartNew(ctx, cfg, certs)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	go first.ManageLearners(ctx, 200*time.Millisecond)
	secondTLS := filepath.Join(t.TempDir(), "tls")
	copyCAs(t, firstTLS, secondTLS)
	secondCerts, err := etcdmember.LoadCertificates(secondTLS, false)
	if err != nil {
		t.Fatal(err)
	}
	second, err := etcdmember.Join(ctx, memberConfig(t, "second", secondTLS), secondCerts, []string{first.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()

	tlsCfg, err := first.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	client := clientOf(t, first, tlsCfg)
	dead, err := client.MemberAddAsLearner(ctx, []string{fmt.Sprintf("https://127.0.0.1:%d", porttest.Free(t))})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the learner that never started removed", 30*time.Second, func() bool {
		list, err := client.MemberList(ctx)
		if err != nil {
			return false
		}
		for _, m := range list.Members {
			if m.ID == dead.Member.ID {
				return false
			}
		}
		return true
	})
	time.Sleep(2 * time.Second) // past the deadline again
	if v, l := voters(t, client); v != 1 || l != 1 {
		t.Fatalf("%d voters and %d learners, want the waiting learner kept beside the one voter", v, l)
	}
}
