// Package etcdmember runs the etcd member a server embeds when servers are
// highly available on their own (k3s's --cluster-init and --server): the
// first server starts a one-member cluster, every other joins it as a
// learner and is promoted by the raft leader once in sync. Peer and client
// traffic is mutual TLS from two CAs of etcd's own, which every server
// holds. The API server reaches the cluster through etcdstore, as it
// reaches an external etcd.
package etcdmember

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/orch-dev/orch/internal/atomicfile"
)

// Ports are etcd's own, as k3s uses them.
const (
	DefaultClientPort = 2379
	DefaultPeerPort   = 2380
)

// Settings for small boards, as k3s's: an SD card's fsync can take
// hundreds of milliseconds, and etcd's defaults (100 ms heartbeats, 1 s
// elections) then elect leaders all day.
const (
	heartbeat       = 500 * time.Millisecond
	electionTimeout = 5 * time.Second
)

// Config is one member.
type Config struct {
	// Dir is the member's data (DATA/server/db/etcd).
	Dir string
	// TLSDir holds etcd's CAs and this member's certificates
	// (DATA/server/tls/etcd).
	TLSDir string
	// NodeName starts the member's name, which a random suffix makes
	// unique (a server removed and joined again is a new member).
	NodeName string
	// IP is where the member listens and is reached by the others.
	IP net.IP
	// ClientPort and PeerPort default to 2379 and 2380.
	ClientPort, PeerPort int
	// ForceNewCluster makes the member forget its peers and form a cluster
	// of itself alone, keeping its data (k3s's --cluster-reset): the way
	// out of a lost quorum.
	ForceNewCluster bool
	// LogLevel is etcd's own (zap, to stderr): warn by default, where it
	// says what is slow (an fsync, an apply) and which peer is lost.
	LogLevel string
	// StalledLearnerAfter is how long the leader lets a learner that could
	// be promoted stay out of sync, or an added member stay unstarted,
	// before it removes it: 5 minutes, as k3s.
	StalledLearnerAfter time.Duration
	Logger              *slog.Logger
}

func (c *Config) setDefaults() {
	if c.ClientPort == 0 {
		c.ClientPort = DefaultClientPort
	}
	if c.PeerPort == 0 {
		c.PeerPort = DefaultPeerPort
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.LogLevel == "" {
		c.LogLevel = "warn"
	}
	if c.StalledLearnerAfter == 0 {
		c.StalledLearnerAfter = 5 * time.Minute
	}
}

func (c *Config) clientURL() string {
	return "https://" + net.JoinHostPort(c.IP.String(), strconv.Itoa(c.ClientPort))
}

func (c *Config) peerURL() string {
	return "https://" + net.JoinHostPort(c.IP.String(), strconv.Itoa(c.PeerPort))
}

// Member is a running member.
type Member struct {
	cfg       Config
	etcd      *embed.Etcd
	name      string
	certs     *Certificates
	closeOnce sync.Once
}

// Initialized says whether dir holds a member's data: such a member
// restarts as what it was, whatever the flags say (as k3s).
func Initialized(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "member", "wal"))
	return err == nil
}

// StartNew starts the first member of a new cluster, or restarts an
// initialized one.
func StartNew(ctx context.Context, cfg Config, certs *Certificates) (*Member, error) {
	cfg.setDefaults()
	name, err := memberName(cfg)
	if err != nil {
		return nil, err
	}
	m := &Member{cfg: cfg, name: name, certs: certs}
	ec, err := m.etcdConfig()
	if err != nil {
		return nil, err
	}
	if !Initialized(cfg.Dir) {
		ec.InitialCluster = name + "=" + cfg.peerURL()
		ec.ClusterState = embed.ClusterStateFlagNew
	}
	return m, m.start(ctx, ec)
}

// Join adds this machine to the cluster whose members serve clients at
// clientURLs, as a learner: it has no vote until the leader promotes it
// (ManageLearners), so a joining member never costs the cluster its
// quorum.
func Join(ctx context.Context, cfg Config, certs *Certificates, clientURLs []string) (*Member, error) {
	cfg.setDefaults()
	if Initialized(cfg.Dir) {
		return StartNew(ctx, cfg, certs)
	}
	name, err := memberName(cfg)
	if err != nil {
		return nil, err
	}
	m := &Member{cfg: cfg, name: name, certs: certs}
	ec, err := m.etcdConfig()
	if err != nil {
		return nil, err
	}
	client, err := certs.Client(clientURLs)
	if err != nil {
		return nil, err
	}
	defer func() { _ = client.Close() }()
	members, err := m.addAsLearner(ctx, client)
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		ec.InitialCluster = initialCluster(members, cfg.peerURL(), name)
		ec.ClusterState = embed.ClusterStateFlagExisting
		err := m.start(ctx, ec)
		if err == nil {
			return m, nil
		}
		// Another server was added between this one's addition and its
		// start (servers started together): etcd wants the membership as
		// it is now.
		if !strings.Contains(err.Error(), "member count is unequal") || attempt == 30 {
			return nil, err
		}
		m.cfg.Logger.Info("another server joined meanwhile: starting with the membership as it is now")
		if !Initialized(cfg.Dir) {
			_ = os.RemoveAll(cfg.Dir)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
		list, err := client.MemberList(ctx)
		if err != nil {
			return nil, fmt.Errorf("list the cluster's members: %w", err)
		}
		members = memberInfos(list.Members)
		if ec, err = m.etcdConfig(); err != nil {
			return nil, err
		}
	}
}

// initialCluster is etcd's --initial-cluster for a member joining the
// cluster of members (its own address named name).
func initialCluster(members []*memberInfo, peerURL, name string) string {
	var initial []string
	for _, mem := range members {
		n := mem.Name
		switch {
		case slices.Contains(mem.PeerURLs, peerURL):
			n = name
		case n == "":
			// Added but not started yet (another join under way).
			n = "unstarted-" + strconv.FormatUint(mem.ID, 16)
		}
		for _, u := range mem.PeerURLs {
			initial = append(initial, n+"="+u)
		}
	}
	return strings.Join(initial, ",")
}

// addAsLearner asks the cluster to take this member as a learner, waiting
// while another learner is being added or the cluster is unhealthy (etcd
// takes one learner at a time by default).
func (m *Member) addAsLearner(ctx context.Context, client *clientv3.Client) ([]*memberInfo, error) {
	peer := m.cfg.peerURL()
	for {
		list, err := client.MemberList(ctx)
		if err != nil {
			return nil, fmt.Errorf("list the cluster's members: %w", err)
		}
		for _, mem := range list.Members {
			if !slices.Contains(mem.PeerURLs, peer) {
				continue
			}
			if mem.Name == "" {
				// An earlier join of this machine was added but never
				// started: take its place.
				return memberInfos(list.Members), nil
			}
			// This address was a member (the machine's data was lost or
			// moved away): that member is gone for good, and its place is
			// taken as k3s takes it.
			m.cfg.Logger.Info("this server's address belonged to a member that is gone: removing it before joining", "member", mem.Name)
			if _, err := client.MemberRemove(ctx, mem.ID); err != nil {
				return nil, fmt.Errorf("remove the member %s that had this server's address: %w", mem.Name, err)
			}
		}
		// raft takes one membership change at a time and drops one
		// proposed meanwhile: an addition that gets no answer is looked
		// for in the membership again, and asked for again.
		actx, cancel := context.WithTimeout(ctx, 20*time.Second)
		resp, err := client.MemberAddAsLearner(actx, []string{peer})
		cancel()
		if err == nil {
			return memberInfos(resp.Members), nil
		}
		retry := errors.Is(err, rpctypes.ErrTooManyLearners) || errors.Is(err, rpctypes.ErrUnhealthy) ||
			errors.Is(err, rpctypes.ErrTimeout) || errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost) ||
			(errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil)
		if !retry {
			return nil, fmt.Errorf("join the cluster as a learner: %w", err)
		}
		m.cfg.Logger.Info("waiting to join the cluster", "why", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

type memberInfo struct {
	ID       uint64
	Name     string
	PeerURLs []string
}

func memberInfos[M interface {
	GetID() uint64
	GetName() string
	GetPeerURLs() []string
}](list []M) []*memberInfo {
	out := make([]*memberInfo, 0, len(list))
	for _, m := range list {
		out = append(out, &memberInfo{ID: m.GetID(), Name: m.GetName(), PeerURLs: m.GetPeerURLs()})
	}
	return out
}

// memberName is the name this data dir's member has, made once.
func memberName(cfg Config) (string, error) {
	path := filepath.Join(filepath.Dir(cfg.Dir), "etcd-name")
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 && Initialized(cfg.Dir) {
		return strings.TrimSpace(string(b)), nil
	}
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return "", err
	}
	name := cfg.NodeName + "-" + hex.EncodeToString(suffix)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	if err := atomicfile.Write(path, []byte(name+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write the etcd member's name: %w", err)
	}
	return name, nil
}

func (m *Member) etcdConfig() (*embed.Config, error) {
	leaves, err := m.certs.issueLeaves(m.cfg.IP)
	if err != nil {
		return nil, err
	}
	ec := embed.NewConfig()
	ec.Name = m.name
	ec.Dir = m.cfg.Dir
	ec.ForceNewCluster = m.cfg.ForceNewCluster
	client, err := url.Parse(m.cfg.clientURL())
	if err != nil {
		return nil, err
	}
	peer, err := url.Parse(m.cfg.peerURL())
	if err != nil {
		return nil, err
	}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	// No HTTP metrics listener or gateway: clients speak gRPC.
	ec.ListenMetricsUrls = nil
	ec.EnableGRPCGateway = false
	ec.ClientTLSInfo = transport.TLSInfo{
		CertFile: leaves.serverCert, KeyFile: leaves.serverKey, TrustedCAFile: m.certs.serverCAFile(), ClientCertAuth: true,
	}
	// A peer is whoever holds a certificate of the peer CA, which servers
	// alone have; its address is not checked against the certificate's,
	// since a board with several addresses (wired and wireless) may dial
	// from another than the one it advertises.
	ec.PeerTLSInfo = transport.TLSInfo{
		CertFile: leaves.peerCert, KeyFile: leaves.peerKey, TrustedCAFile: m.certs.peerCAFile(), ClientCertAuth: true,
		SkipClientSANVerify: true,
	}
	ec.TickMs = uint(heartbeat / time.Millisecond)
	ec.ElectionMs = uint(electionTimeout / time.Millisecond)
	// orch compacts (one server at a time, etcdstore); the quota is the
	// 32-bit bbolt's map limit.
	ec.AutoCompactionRetention = "0"
	ec.QuotaBackendBytes = 2 << 30
	ec.BootstrapDefragThresholdMegabytes = 100
	// Two learners at once: the second server waits as one until a third
	// joins (an even number of voters is refused, ManageLearners).
	ec.MaxLearners = 2
	ec.SocketOpts = transport.SocketOpts{ReuseAddress: true}
	ec.Logger = "zap"
	ec.LogLevel = m.cfg.LogLevel
	ec.LogOutputs = []string{"stderr"}
	return ec, nil
}

func (m *Member) start(ctx context.Context, ec *embed.Config) error {
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return fmt.Errorf("start the etcd member: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("the etcd member failed: %w", err)
	case <-e.Server.StopNotify():
		e.Close()
		return errors.New("the etcd member stopped while starting (its log above says why)")
	case <-ctx.Done():
		e.Close()
		return ctx.Err()
	}
	m.etcd = e
	m.cfg.Logger.Info("etcd member started", "name", m.name, "client", m.cfg.clientURL(), "peer", m.cfg.peerURL())
	return nil
}

// Name is the member's name in the cluster.
func (m *Member) Name() string { return m.name }

// ClientURL is where the member serves clients.
func (m *Member) ClientURL() string { return m.cfg.clientURL() }

// ClientTLS is what a client of the cluster presents and trusts.
func (m *Member) ClientTLS() (*tls.Config, error) { return m.certs.ClientTLS() }

// Done is closed when the member stops, on its own too (removed from the
// cluster, a fatal error, which etcd logs).
func (m *Member) Done() <-chan struct{} { return m.etcd.Server.StopNotify() }

// IsLearner says whether the member has no vote yet (etcd's own
// IsLearner panics once the member is removed).
func (m *Member) IsLearner() bool {
	mem := m.etcd.Server.Cluster().Member(m.etcd.Server.MemberID())
	return mem != nil && mem.IsLearner
}

// Close stops the member.
func (m *Member) Close() {
	if m.etcd != nil {
		m.closeOnce.Do(m.etcd.Close)
	}
}

// ManageLearners promotes the cluster's learners once they are in sync,
// while this member leads (as k3s's leader does), and keeps the number of
// voters odd: with one voter, a learner waits for a second one, since two
// voters halt the cluster when either fails and so are less available than
// one.
func (m *Member) ManageLearners(ctx context.Context, every time.Duration) {
	client, err := m.certs.Client([]string{m.cfg.clientURL()})
	if err != nil {
		m.cfg.Logger.Error("learners cannot be promoted", "err", err)
		return
	}
	defer func() { _ = client.Close() }()
	st := learnerState{waiting: map[uint64]bool{}, lagging: map[uint64]time.Time{}}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.Done():
			return
		case <-t.C:
		}
		if m.etcd.Server.Leader() != m.etcd.Server.MemberID() {
			clear(st.lagging) // another leader's to judge
			continue
		}
		if err := m.promote(ctx, client, &st); err != nil && ctx.Err() == nil {
			m.cfg.Logger.Warn("promoting learners", "err", err)
		}
	}
}

// learnerState is what the leader remembers of learners between rounds.
type learnerState struct {
	waiting map[uint64]bool      // told it waits for another server (logged once)
	lagging map[uint64]time.Time // since when it could be promoted but is not in sync, or has not started
}

func (m *Member) promote(ctx context.Context, client *clientv3.Client, st *learnerState) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := client.MemberList(ctx)
	if err != nil {
		return err
	}
	voters := 0
	var learners, lagging []uint64
	names := map[uint64]string{}
	for _, mem := range list.Members {
		names[mem.ID] = mem.Name
		switch {
		case !mem.IsLearner:
			voters++
		case mem.Name != "": // started
			learners = append(learners, mem.ID)
		default: // added, its server not started (yet)
			lagging = append(lagging, mem.ID)
		}
	}
	for id := range st.lagging {
		if _, ok := names[id]; !ok {
			delete(st.lagging, id)
		}
	}
	slices.Sort(learners)
	n := PromotionsFor(voters, len(learners))
	for _, id := range learners[n:] {
		delete(st.lagging, id) // it waits on purpose
		if !st.waiting[id] {
			st.waiting[id] = true
			m.cfg.Logger.Info("a server waits as a learner for another to join: an even number of voting members is less available than one fewer",
				"member", names[id], "voters", voters)
		}
	}
	for _, id := range learners[:n] {
		if _, err := client.MemberPromote(ctx, id); err != nil {
			if errors.Is(err, rpctypes.ErrMemberLearnerNotReady) {
				lagging = append(lagging, id) // not in sync yet: the next round
				continue
			}
			return fmt.Errorf("promote %s: %w", names[id], err)
		}
		delete(st.waiting, id)
		delete(st.lagging, id)
		m.cfg.Logger.Info("learner promoted to a voting member", "member", names[id])
	}
	// A learner that never catches up (its server died while joining, or
	// cannot keep up) holds one of the cluster's few learner places and
	// keeps others from joining: it is removed, as k3s does; its server
	// joins anew when started again with --server.
	now := time.Now()
	for _, id := range lagging {
		since, ok := st.lagging[id]
		if !ok {
			st.lagging[id] = now
			continue
		}
		if now.Sub(since) < m.cfg.StalledLearnerAfter {
			continue
		}
		if _, err := client.MemberRemove(ctx, id); err != nil {
			return fmt.Errorf("remove the learner %x, not in sync for %s: %w", id, now.Sub(since).Round(time.Second), err)
		}
		delete(st.lagging, id)
		m.cfg.Logger.Warn("removed a learner not in sync or not started for too long: its server joins again when started with --server",
			"member", names[id], "id", fmt.Sprintf("%x", id), "for", now.Sub(since).Round(time.Second))
	}
	return nil
}

// PromotionsFor is how many of learners to promote beside voters: as many
// as leave an odd number of voters.
func PromotionsFor(voters, learners int) int {
	n := learners
	if (voters+n)%2 == 0 && n > 0 {
		n--
	}
	return n
}

// zapNop keeps the clients used here quiet; errors are returned.
var zapNop = zap.NewNop()

// VoterClientURLs are where the cluster's voting members serve clients,
// this member's first when it votes: a learner serves no client request
// but serializable reads, so a client is sent to voters only. Read from the
// member's own view of the membership (no request: a learner could not
// answer it).
func (m *Member) VoterClientURLs() []string {
	var own, others []string
	for _, mem := range m.etcd.Server.Cluster().Members() {
		if mem.IsLearner || mem.Name == "" {
			continue
		}
		if mem.ID == m.etcd.Server.MemberID() {
			own = append(own, mem.ClientURLs...)
		} else {
			others = append(others, mem.ClientURLs...)
		}
	}
	return append(own, others...)
}

// Restore replaces the member's data with a snapshot's, as a cluster of
// this one member (k3s's --cluster-reset-restore-path); the data there
// before is kept beside it, in etcd-old-<unix time>. Revisions jump by a
// billion and what came before is marked compacted, as Kubernetes restores
// etcd: a client resuming a watch from before the snapshot is told to list
// again instead of being sent history that no longer matches.
func Restore(cfg Config, snapshotPath string) error {
	cfg.setDefaults()
	if _, err := os.Stat(snapshotPath); err != nil {
		return fmt.Errorf("the snapshot: %w", err)
	}
	if _, err := os.Stat(cfg.Dir); err == nil {
		old, err := keepAside(cfg.Dir, time.Now())
		if err != nil {
			return fmt.Errorf("keep the member's data aside: %w", err)
		}
		cfg.Logger.Info("the member's data before the restore is kept", "path", old)
	}
	name, err := memberName(cfg)
	if err != nil {
		return err
	}
	err = snapshot.NewV3(zapNop).Restore(snapshot.RestoreConfig{
		SnapshotPath: snapshotPath, Name: name, OutputDataDir: cfg.Dir,
		PeerURLs: []string{cfg.peerURL()}, InitialCluster: name + "=" + cfg.peerURL(), InitialClusterToken: "orch",
		RevisionBump: 1_000_000_000, MarkCompacted: true,
	})
	if err != nil {
		return fmt.Errorf("restore %s: %w", snapshotPath, err)
	}
	return nil
}

// keepAside renames dir to dir-old-<unix time>, or, when a restore in the
// same second kept one there already, to dir-old-<unix time>-<n>: the data
// of an earlier restore is never overwritten.
func keepAside(dir string, now time.Time) (string, error) {
	base := fmt.Sprintf("%s-old-%d", dir, now.Unix())
	for n := 1; n < 1000; n++ {
		old := base
		if n > 1 {
			old = fmt.Sprintf("%s-%d", base, n)
		}
		if _, err := os.Lstat(old); err == nil {
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		if err := os.Rename(dir, old); err != nil {
			return "", err
		}
		return old, nil
	}
	return "", fmt.Errorf("%s-*: too many kept in one second", base)
}

// IsLeader says whether this member leads the cluster.
func (m *Member) IsLeader() bool { return m.etcd.Server.Leader() == m.etcd.Server.MemberID() }

// Removed says whether the member stopped because the cluster removed it.
// It asks the other members too: etcd stops a member on its peers' word
// that it was removed, sometimes before the member applied its own
// removal, and then its own membership still lists it.
func (m *Member) Removed() bool {
	id := m.etcd.Server.MemberID()
	cluster := m.etcd.Server.Cluster()
	if cluster.Member(id) == nil {
		return true
	}
	var others []string
	for _, mem := range cluster.Members() {
		if mem.ID != id {
			others = append(others, mem.ClientURLs...)
		}
	}
	if len(others) == 0 {
		return false
	}
	client, err := m.certs.Client(others)
	if err != nil {
		return false
	}
	defer func() { _ = client.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := client.MemberList(ctx)
	if err != nil {
		return false
	}
	for _, mem := range list.Members {
		if mem.ID == uint64(id) {
			return false
		}
	}
	return true
}

// Remove takes the member named name out of the cluster; done is false
// when it is this member, which leads: leadership goes to another voter
// first, and the next leader removes it. The cluster's last voter stays
// (done, with a warning): without it there is no cluster.
func (m *Member) Remove(ctx context.Context, name string) (done bool, err error) {
	client, err := m.certs.Client([]string{m.cfg.clientURL()})
	if err != nil {
		return false, err
	}
	defer func() { _ = client.Close() }()
	list, err := client.MemberList(ctx)
	if err != nil {
		return false, err
	}
	var target *memberInfo
	var others []uint64
	for _, mem := range list.Members {
		switch {
		case mem.Name == name:
			target = &memberInfo{ID: mem.ID, Name: mem.Name}
		case !mem.IsLearner && mem.Name != "":
			others = append(others, mem.ID)
		}
	}
	switch {
	case target == nil:
		return true, nil // gone already
	case len(others) == 0:
		m.cfg.Logger.Warn("the cluster's only voting member is not removed: without it there is no cluster", "member", name)
		return true, nil
	case target.ID == uint64(m.etcd.Server.MemberID()):
		if _, err := client.MoveLeader(ctx, others[0]); err != nil {
			return false, fmt.Errorf("hand leadership over before leaving: %w", err)
		}
		return false, nil
	}
	if _, err := client.MemberRemove(ctx, target.ID); err != nil && !errors.Is(err, rpctypes.ErrMemberNotFound) {
		return false, fmt.Errorf("remove member %s: %w", name, err)
	}
	m.cfg.Logger.Info("etcd member removed", "member", name)
	return true, nil
}

// SnapshotFile writes a snapshot of a member that is not running, from its
// backend file, in the format etcd's snapshot API sends (the database
// followed by its SHA-256, which a restore checks), and returns the
// revision it holds. A running member's file is locked: ask its server.
func SnapshotFile(dir string, w io.Writer) (int64, error) {
	path := filepath.Join(dir, "member", "snap", "db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return 0, fmt.Errorf("%s is open in a running etcd member: snapshot it through its server", path)
	}
	if err != nil {
		return 0, fmt.Errorf("the member's data: %w", err)
	}
	defer func() { _ = db.Close() }()
	var rev int64
	err = db.View(func(tx *bolt.Tx) error {
		keys := tx.Bucket([]byte("key"))
		if keys == nil {
			return fmt.Errorf("%s is not an etcd member's backend", path)
		}
		// A key of the bucket is a revision: 8 bytes of main revision
		// first, big-endian.
		if k, _ := keys.Cursor().Last(); len(k) >= 8 {
			rev = int64(binary.BigEndian.Uint64(k[:8]))
		}
		h := sha256.New()
		if _, err := tx.WriteTo(io.MultiWriter(w, h)); err != nil {
			return err
		}
		_, err := w.Write(h.Sum(nil))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("snapshot %s: %w", path, err)
	}
	return rev, nil
}

// ReadKey is the value of key in the backend of a member that is not
// running (as after Restore, before its first start): what the cluster
// keeps for a server to take its identity from.
func ReadKey(dir, key string) ([]byte, error) {
	path := filepath.Join(dir, "member", "snap", "db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("the member's data: %w", err)
	}
	defer func() { _ = db.Close() }()
	var value []byte
	err = db.View(func(tx *bolt.Tx) error {
		keys := tx.Bucket([]byte("key"))
		if keys == nil {
			return fmt.Errorf("%s is not an etcd member's backend", path)
		}
		// Revisions in order: the last one of the key is its value now,
		// or its deletion (a tombstone, its revision marked 't').
		return keys.ForEach(func(rev, raw []byte) error {
			var kv mvccpb.KeyValue
			if err := proto.Unmarshal(raw, &kv); err != nil {
				return fmt.Errorf("revision %x: %w", rev, err)
			}
			if string(kv.Key) != key {
				return nil
			}
			value = nil
			if len(rev) == 18 && rev[17] == 't' {
				return nil
			}
			value = slices.Clone(kv.Value)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	if value == nil {
		return nil, fmt.Errorf("%s holds no %s", path, key)
	}
	return value, nil
}

// IsSnapshot says whether the file is a snapshot of etcd (rather than of
// orch's own store, which a server that runs alone restores).
func IsSnapshot(path string) bool {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return false
	}
	defer func() { _ = db.Close() }()
	return db.View(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte("key")) == nil || tx.Bucket([]byte("meta")) == nil {
			return errors.New("not etcd's")
		}
		return nil
	}) == nil
}

// CountMembers asks the cluster for its voting members and learners.
func CountMembers(ctx context.Context, c *clientv3.Client) (voters, learners int, err error) {
	list, err := c.MemberList(ctx)
	if err != nil {
		return 0, 0, err
	}
	for _, m := range list.Members {
		if m.IsLearner {
			learners++
		} else {
			voters++
		}
	}
	return voters, learners, nil
}
