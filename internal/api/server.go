// Package api is orch's API server: the only component that touches the
// store. It serves the Kubernetes REST API over HTTPS to kubectl, client-go,
// the control loops and the agents, behind authentication, authorization
// and admission; it owns the cluster PKI and the join token.
//
// Sub-packages: pki (CA, certificates, token), auth (who may do what),
// resources (what each resource is), registry (Kubernetes semantics over
// the store), rest (HTTP), alloc (Service IPs and node ports).
package api

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/orch-dev/orch/internal/api/admission/plugins"
	"github.com/orch-dev/orch/internal/api/admission/podsecurity"
	"github.com/orch-dev/orch/internal/api/aggregator"
	"github.com/orch-dev/orch/internal/api/auth/nodegraph"
	"github.com/orch-dev/orch/internal/gatewayapi"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/orch-dev/orch/internal/api/admission/policy"
	"github.com/orch-dev/orch/internal/api/admission/webhook"
	"github.com/orch-dev/orch/internal/api/alloc"
	"github.com/orch-dev/orch/internal/api/auth"
	"github.com/orch-dev/orch/internal/api/auth/rbac"
	"github.com/orch-dev/orch/internal/api/auth/satoken"
	"github.com/orch-dev/orch/internal/api/etcdmember"
	"github.com/orch-dev/orch/internal/api/join"
	"github.com/orch-dev/orch/internal/api/kubelet"
	"github.com/orch-dev/orch/internal/api/metricsapi"
	"github.com/orch-dev/orch/internal/api/openapi"
	"github.com/orch-dev/orch/internal/api/pki"
	"github.com/orch-dev/orch/internal/api/registry"
	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/api/resources/authorization"
	"github.com/orch-dev/orch/internal/api/resources/builtin"
	metricsgroup "github.com/orch-dev/orch/internal/api/resources/metrics"
	"github.com/orch-dev/orch/internal/api/rest"
	"github.com/orch-dev/orch/internal/joinproto"
	"github.com/orch-dev/orch/internal/kubeversion"
	"github.com/orch-dev/orch/internal/metrics"
	"github.com/orch-dev/orch/internal/store"
	"github.com/orch-dev/orch/internal/store/boltstore"
	"github.com/orch-dev/orch/internal/upgradeapi"
)

// Config is what `orch server` is started with.
type Config struct {
	DataDir     string
	BindAddress string
	// Port to listen on; 0 picks a free one (tests).
	Port             int
	AdvertiseAddress string
	// Token is the join secret (or a full K10 token); empty generates one.
	Token string
	// TokenAuthFile is Kubernetes' static token CSV for bearer tokens.
	TokenAuthFile  string
	KubeconfigPath string
	ServiceCIDR    string
	ClusterCIDR    string
	// ClusterDNS is the kube-dns Service's cluster IP (--cluster-dns);
	// empty makes none.
	ClusterDNS string
	// Version is orch's own version, reported in /version.
	Version string
	Logger  *slog.Logger
	// BookmarkInterval and CompactInterval shorten timers for tests.
	BookmarkInterval time.Duration
	CompactInterval  time.Duration
	// WaitForLoops keeps /readyz false until LoopsStarted is called.
	WaitForLoops bool
	// EventTTL is how long events are kept (default one hour).
	EventTTL time.Duration
	// MaxRequestsInFlight and MaxMutatingRequestsInFlight bound the reads
	// and writes served at once (0: DefaultMaxRequestsInFlight and
	// DefaultMaxMutatingRequestsInFlight).
	MaxRequestsInFlight, MaxMutatingRequestsInFlight int
	// MaxConnectionsPerSource bounds the connections one address holds
	// open (0: DefaultMaxConnectionsPerSource).
	MaxConnectionsPerSource int
	// Store, when set, is the backend (the server closes it); by default
	// the server opens its bbolt store under DataDir, or the etcd that
	// Datastore names.
	Store store.Store
	// Datastore is an external etcd to keep the cluster's state in
	// (k3s's --datastore-endpoint and its TLS files).
	Datastore Datastore
	// Embedded makes the servers hold the state themselves, each an etcd
	// member (--cluster-init, --server).
	Embedded *Embedded
	// NodeName is the Node of this server's own agent (none with
	// --disable-agent): with Embedded, it names the server's etcd member,
	// which deleting the Node removes.
	NodeName string
	// MemberCheckInterval is how often deleted servers' members are looked
	// for (default 5 s).
	MemberCheckInterval time.Duration
	// DisableProfiling stops serving the process's profiles at
	// /debug/pprof/ (kube-apiserver's --profiling=false).
	DisableProfiling bool
	// DisableWatchCache serves every LIST and WATCH from the store, as
	// kube-apiserver's --watch-cache=false.
	DisableWatchCache bool
	// DisableLocalStorage leaves out the local-path StorageClass (k3s's
	// --disable local-storage).
	DisableLocalStorage bool
	// DisableIngress leaves out the orch IngressClass, so the nodes serve
	// no Ingress and leave ports 80 and 443 to another controller (k3s's
	// --disable traefik).
	DisableIngress bool
	// SnapshotSchedule is when store snapshots are taken (cron syntax; ""
	// takes none on a schedule), SnapshotRetention how many scheduled
	// ones are kept, SnapshotDir where (default DATA/server/db/snapshots).
	SnapshotSchedule  string
	SnapshotRetention int
	SnapshotDir       string
	// CertificateCheckInterval is how often the server renews its
	// certificates that are within 90 days of expiry (default 12 h).
	CertificateCheckInterval time.Duration
	// SecretsEncryption encrypts Secrets at rest (k3s's
	// --secrets-encryption): the configuration is made at
	// EncryptionConfigPath on first start, and stays in force after.
	SecretsEncryption bool
	// PodSecurityConfigFile is Pod Security Admission's configuration
	// (k3s's and kube-apiserver's --pod-security-admission-config-file:
	// an AdmissionConfiguration or a PodSecurityConfiguration): the
	// cluster's default levels and exemptions. Empty: Kubernetes'
	// defaults, privileged.
	PodSecurityConfigFile string
	// PodsBehindNodes says the server's machine is not on the pod
	// network (it runs no agent): pods are reached through their nodes'
	// kubelet API.
	PodsBehindNodes bool
	// MetricsResolution is how often the nodes' CPU and memory are read
	// for metrics.k8s.io (default metricsapi.DefaultResolution).
	MetricsResolution time.Duration
}

// kubeletClientName names the pair the server presents to the nodes'
// kubelet API, under DATA/server/tls.
const kubeletClientName = "client-kubelet"

// minTokenSecret is the shortest user-chosen join secret accepted
// without a warning (a generated one has 32 hex characters).
const minTokenSecret = 16

// Server is a running API server.
type Server struct {
	cfg   Config
	log   *slog.Logger
	store store.Store
	// storages are the built-in resources' storages, for the server's own
	// admission and bootstrap; catalog is what the API serves.
	storages map[schema.GroupResource]*registry.Storage
	catalog  *registry.Catalog
	// authority is the cluster CA; orch certificate rotate-ca replaces it.
	authority atomic.Pointer[pki.CA]
	// serving is the certificate the API presents (renewed while it
	// serves), for the names servingNames; tlsDir holds the pairs.
	serving      atomic.Pointer[tls.Certificate]
	servingNames pki.ServingNames
	tlsDir       string
	admin        pki.KeyPair
	// releaseFetch has one release fetched from another server at a time.
	releaseFetch sync.Mutex
	// aggregator proxies the group/versions APIServices give to
	// Services; frontProxy is the client certificate it presents them,
	// frontProxyCA what they trust it by.
	aggregator   *aggregator.Aggregator
	frontProxy   atomic.Pointer[tls.Certificate]
	frontProxyCA []byte
	// kubeletClient is what kubelets presents to the nodes.
	kubeletClient pki.KeyPair
	// certMu serializes rotations of the server's certificates.
	certMu   sync.Mutex
	kubelets *kubelet.Client
	// podDial connects to pods (webhooks, pods/proxy, services/proxy).
	podDial *podDialer
	// usage serves metrics.k8s.io from the nodes' resource metrics.
	usage *metricsapi.Source
	// metrics are the server's own, served at /metrics.
	metrics *apiMetrics
	// encryption, when set, encrypts resources at rest.
	encryption *encryptionState
	// token is the join token (under tokenMu: orch token rotate replaces
	// it), joins the handler that checks its secret.
	tokenMu   sync.Mutex
	token     string
	joins     *join.Handler
	listener  net.Listener
	handler   http.Handler
	advertise netip.Addr
	ready     atomic.Bool
	// loopsReady is set once the control loops run (Config.WaitForLoops).
	loopsReady atomic.Bool
	// graph is the node authorizer's view of pods, claimVolumes of which
	// claim each volume is bound to.
	graph          *nodegraph.Graph
	claimVolumes   *nodegraph.Claims
	ingressSecrets *nodegraph.IngressSecrets
	gatewaySecrets *nodegraph.GatewaySecrets
	// rbac is the RBAC authorizer's index of roles and bindings; authz
	// the whole chain, which admission asks too (escalation checks).
	rbac  *rbac.Index
	authz *auth.Authorizer
	authn *auth.Authenticator
	// issuer signs and verifies service-account tokens; accounts is which
	// service accounts exist, for checking them.
	issuer   *satoken.Issuer
	accounts *serviceAccountUIDs
	inFlight *inFlight
	// admission is the built-in admission plugins.
	admission *plugins.Plugins
	// caches is the watch caches' lifetime, set when Run starts.
	caches atomic.Pointer[context.Context]
	// webhooks calls the cluster's admission webhooks; policies runs its
	// ValidatingAdmissionPolicies.
	webhooks         *webhook.Dispatcher
	policies         *policy.Validating
	mutatingPolicies *policy.Mutating
	// endpointsSeen are the API servers the kubernetes Service was last
	// set to, so that what is left out is said once per change.
	endpointsMu   sync.Mutex
	endpointsSeen []netip.Addr
	// member is this server's etcd member, with Embedded.
	member *etcdmember.Member
	// serverSecret is the server token's secret, with Embedded.
	serverSecret string
	// datastoreCheck guards the last /readyz check of a shared datastore.
	datastoreCheck     sync.Mutex
	datastoreCheckedAt time.Time
	datastoreErr       error
}

// Metrics is the registry the server's /metrics serves, where the control
// loops running beside it register theirs.
func (s *Server) Metrics() prometheus.Registerer { return s.metrics.registry }

// LoopsStarted tells the server its control loops run, for /readyz.
func (s *Server) LoopsStarted() { s.loopsReady.Store(true) }

// New prepares the server: PKI, store, default objects, kubeconfig, and the
// listening socket. Run serves.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ServiceCIDR == "" {
		cfg.ServiceCIDR = "10.43.0.0/16"
	}
	s := &Server{cfg: cfg, log: cfg.Logger, storages: map[schema.GroupResource]*registry.Storage{}, graph: nodegraph.NewGraph(), claimVolumes: nodegraph.NewClaims(), ingressSecrets: nodegraph.NewIngressSecrets(), gatewaySecrets: nodegraph.NewGatewaySecrets(), accounts: newServiceAccountUIDs(),
		inFlight: newInFlight(cfg.MaxRequestsInFlight, cfg.MaxMutatingRequestsInFlight)}
	serverDir := filepath.Join(cfg.DataDir, "server")
	tlsDir := filepath.Join(serverDir, "tls")
	if err := os.MkdirAll(tlsDir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", tlsDir, err)
	}
	ips, err := alloc.NewIPs(cfg.ServiceCIDR)
	if err != nil {
		return nil, err
	}
	if s.advertise, err = advertiseAddress(cfg.AdvertiseAddress); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok && s.store != nil {
			_ = s.store.Close()
		}
		if !ok && s.member != nil {
			s.member.Close()
		}
	}()
	// Servers on one datastore are one cluster: its identity comes from
	// there, before this server loads or makes its own.
	var secret string
	clusterMade := true
	// freshIdentity: this start makes the server's CA (it has never run).
	freshIdentity := false
	if cfg.Embedded != nil && cfg.Datastore.Endpoint != "" {
		return nil, errors.New("--datastore-endpoint names an external etcd; --cluster-init and --server run the servers' own: choose one")
	}
	if s.store = cfg.Store; s.store == nil && s.sharedStore() {
		if cfg.Embedded != nil {
			// The seal is the server token's: an agent's token opens nothing.
			if secret, err = s.startMember(ctx, serverDir); err != nil {
				return nil, err
			}
		} else {
			if s.store, err = openDatastore(ctx, cfg.Datastore, cfg.CompactInterval, s.expiringKeys(), cfg.Logger); err != nil {
				return nil, err
			}
			if secret, err = tokenSecret(cfg.Token, serverDir); err != nil {
				return nil, err
			}
		}
		if clusterMade, err = s.pullBootstrap(ctx, serverDir, secret); err != nil {
			return nil, err
		}
		if !clusterMade {
			// The first server: what it ran before becomes the cluster's.
			if err := s.moveIntoDatastore(ctx, serverDir); err != nil {
				return nil, err
			}
			_, err := os.Stat(filepath.Join(tlsDir, "ca.crt"))
			freshIdentity = errors.Is(err, os.ErrNotExist)
		}
	}
	if err := s.loadPKI(tlsDir, serverDir, ips.First()); err != nil {
		return nil, err
	}
	if err := s.loadFrontProxy(tlsDir); err != nil {
		return nil, err
	}
	s.aggregator = aggregator.New(webhookServices{s}, s.frontProxyCert, s.log)
	s.admission = plugins.New(s.servedStorageOf, s.log)
	podSecurity, err := podsecurity.LoadConfig(cfg.PodSecurityConfigFile)
	if err != nil {
		return nil, err
	}
	if err := s.admission.UsePodSecurity(podSecurity); err != nil {
		return nil, err
	}
	s.rbac = rbac.NewIndex(5 * time.Second)
	s.authz = auth.NewAuthorizer(nodegraph.Relations{Graph: s.graph, Claims: s.claimVolumes, Ingresses: s.ingressSecrets, Gateways: s.gatewaySecrets}, s.rbac)
	s.metrics = newAPIMetrics(s)
	s.usage = metricsapi.New(servedStorage{s, "nodes"}, servedStorage{s, "pods"}, s.kubelets, cfg.MetricsResolution, s.log)
	all := append(builtin.Resources(), authorization.Resources(s.answerReview)...)
	all = append(all, metricsgroup.Resources(s.usage.Nodes(), s.usage.Pods())...)
	s.serveTokenRequests(all)
	s.serveEvictions(all)
	if s.store == nil {
		if s.store, err = boltstore.Open(filepath.Join(serverDir, "db"), boltstore.Options{
			VolatilePrefixes: registry.VolatilePrefixes(all), CompactInterval: cfg.CompactInterval, Logger: cfg.Logger,
		}); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
	}
	addr := net.JoinHostPort(cfg.BindAddress, strconv.Itoa(cfg.Port))
	if s.listener, err = net.Listen("tcp", addr); err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	defer func() {
		if !ok {
			_ = s.listener.Close()
		}
	}()
	s.podDial = newPodDialer(s)
	s.webhooks = s.newWebhooks()
	s.mutatingPolicies, s.policies = s.newPolicies()
	svcIPs := &serviceIPs{ips: ips, ports: alloc.NewPorts(30000, 32767)}
	if s.sharedStore() {
		svcIPs.claims = &claims{store: s.store, log: s.log}
	}
	if err := s.loadEncryption(); err != nil {
		return nil, err
	}
	if s.member != nil {
		if err := s.writeServerToken(serverDir); err != nil {
			return nil, fmt.Errorf("write the server token: %w", err)
		}
	}
	if !clusterMade {
		if s.member == nil {
			tok, err := joinproto.ParseToken(s.token)
			if err != nil {
				return nil, err
			}
			secret = tok.Secret
		}
		if err := s.pushBootstrap(ctx, serverDir, secret, freshIdentity); err != nil {
			return nil, err
		}
	}
	if err := s.buildStorages(all, svcIPs); err != nil {
		return nil, err
	}
	if err := svcIPs.restore(ctx, s.storage("", "services"), s.log); err != nil {
		return nil, err
	}
	if err := s.bootstrap(ctx, ips.First()); err != nil {
		return nil, fmt.Errorf("create default objects: %w", err)
	}
	if cfg.KubeconfigPath != "" {
		if err := s.writeKubeconfig(cfg.KubeconfigPath); err != nil {
			if _, statErr := os.Stat(cfg.KubeconfigPath); statErr != nil {
				return nil, err
			}
			// The one there still reaches this server unless its address
			// changed; a full disk must not keep the cluster down.
			s.log.Warn("the admin kubeconfig could not be rewritten: keeping the old one", "path", cfg.KubeconfigPath, "err", err)
		}
	}
	if s.handler, err = s.buildHandler(); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

func (s *Server) storage(group, resource string) *registry.Storage {
	return s.storages[schema.GroupResource{Group: group, Resource: resource}]
}

// servedStorageOf is a built-in resource's storage, or a custom
// resource's as the catalog serves it now (nil when it is not served),
// for the built-in admission.
func (s *Server) servedStorageOf(group, resource string) *registry.Storage {
	if st := s.storage(group, resource); st != nil {
		return st
	}
	gr := schema.GroupResource{Group: group, Resource: resource}
	for _, st := range s.catalog.Load().Storages {
		if st.Resource.GroupResource() == gr {
			return st
		}
	}
	return nil
}

// servedStorage is a core resource's storage, looked up when used (the
// metrics source is made before the storages).
type servedStorage struct {
	s        *Server
	resource string
}

func (st servedStorage) Get(ctx context.Context, namespace, name string) (runtime.Object, error) {
	return st.s.storage("", st.resource).Get(ctx, namespace, name)
}

func (st servedStorage) List(ctx context.Context, namespace string, opts *metav1.ListOptions) (runtime.Object, error) {
	return st.s.storage("", st.resource).List(ctx, namespace, opts)
}

func (s *Server) buildStorages(all []*resources.Resource, svcIPs *serviceIPs) error {
	var list []*registry.Storage
	for _, r := range all {
		backend, err := s.storeFor(r)
		if err != nil {
			return err
		}
		st := registry.New(backend, r)
		if s.storages[r.GroupResource()] == nil {
			// A kind served at several versions is looked up at its
			// first, preferred one.
			s.storages[r.GroupResource()] = st
		}
		list = append(list, st)
	}
	if err := s.checkEncryptedResources(); err != nil {
		return err
	}
	s.storage("", "nodes").Released = join.ForgetNodePassword(s.storage("", "secrets"), s.log)
	services := s.storage("", "services")
	services.Released, services.Committed, services.Abandoned = svcIPs.release, svcIPs.committed, svcIPs.abandoned
	// Each resource's own steps, after the built-in plugins: what a
	// Service takes from the allocators, a certificate request's checks,
	// and RBAC's escalation check.
	own := map[schema.GroupResource][]plugins.Func{{Resource: "services"}: {svcIPs.admit}, signingRequests: {s.admitSigningRequest}, trustBundles: {s.admitTrustBundle}, podCertificateRequests: {s.admitPodCertificateRequest}}
	for _, kind := range rbac.Kinds {
		own[schema.GroupResource{Group: rbacv1.GroupName, Resource: kind}] = []plugins.Func{s.escalation}
	}
	for _, st := range list {
		st.Admit = s.admission.For(st.Resource, own[st.Resource.GroupResource()]...)
		st.AdmitDelete = s.admission.AdmitDelete(st.Resource)
		st.External = s.clusterAdmission()
		st.Quota = s.admission.Quota(st.Resource)
	}
	var err error
	s.catalog, err = registry.NewCatalog(list...)
	return err
}

func (s *Server) loadPKI(tlsDir, serverDir string, firstServiceIP netip.Addr) error {
	ca, err := pki.LoadOrCreateCA(tlsDir)
	if err != nil {
		return err
	}
	s.authority.Store(ca)
	names := servingNames(s.advertise, firstServiceIP)
	// The address it is bound to, which clients of this machine use.
	if bind := net.ParseIP(s.cfg.BindAddress); bind != nil && !bind.IsUnspecified() {
		names.IPs = append(names.IPs, bind)
	}
	serving, err := s.ca().LoadOrIssueServing(tlsDir, "serving", names)
	if err != nil {
		return err
	}
	servingCert, err := serving.TLS()
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	s.serving.Store(&servingCert)
	s.tlsDir, s.servingNames = tlsDir, names
	if s.admin, err = s.ca().LoadOrIssueClient(tlsDir, "client-admin", "system:admin", []string{auth.GroupMasters}); err != nil {
		return err
	}
	// What the API server presents to the nodes' kubelet API.
	if s.kubeletClient, err = s.ca().LoadOrIssueClient(tlsDir, kubeletClientName, "system:kube-apiserver", []string{auth.GroupMasters}); err != nil {
		return err
	}
	cert, err := s.kubeletClient.TLS()
	if err != nil {
		return fmt.Errorf("kubelet client certificate: %w", err)
	}
	s.kubelets = kubelet.New(cert, s.ca().Pool())
	keys, err := satoken.LoadOrCreateKeys(tlsDir)
	if err != nil {
		return err
	}
	s.issuer = satoken.NewIssuer(serviceAccountIssuer, nil, keys, nil)
	if s.token, err = s.ca().LoadOrCreateToken(filepath.Join(serverDir, "token"), s.cfg.Token); err != nil {
		return err
	}
	if tok, err := joinproto.ParseToken(s.token); err == nil && s.cfg.Token != "" && len(tok.Secret) < minTokenSecret {
		s.log.Warn(fmt.Sprintf("the join token's secret is shorter than %d characters: anyone who guesses it can join a node", minTokenSecret), "length", len(tok.Secret))
	}
	return nil
}

// serviceAccountIssuer is the iss of the cluster's service-account
// tokens, and the API's audience: what k3s and kubeadm clusters use.
const serviceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

// apiServerNames are the DNS names the API server's certificate holds
// for the kubernetes Service.
var apiServerNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}

// joinPolicy keeps the API server's names and the Services' addresses out
// of node certificates.
func (s *Server) joinPolicy() join.Policy {
	cidr, _ := netip.ParsePrefix(s.cfg.ServiceCIDR)
	return join.Policy{ReservedNames: apiServerNames, ClusterDomain: "cluster.local", ServiceCIDR: cidr.Masked()}
}

// servingNames are the names and addresses clients reach the server by.
func servingNames(advertise, firstServiceIP netip.Addr) pki.ServingNames {
	names := pki.ServingNames{
		DNS: append([]string{}, apiServerNames...),
		IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IP(firstServiceIP.AsSlice()), net.IP(advertise.AsSlice())},
	}
	if host, err := os.Hostname(); err == nil && host != "" {
		names.DNS = append(names.DNS, host)
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
				names.IPs = append(names.IPs, ipn.IP)
			}
		}
	}
	return names
}

// advertiseAddress is the configured address, else the host's first
// non-loopback IPv4 address, else loopback.
func advertiseAddress(configured string) (netip.Addr, error) {
	if configured != "" {
		a, err := netip.ParseAddr(configured)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("--advertise-address %q: %w", configured, err)
		}
		return a, nil
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
				if a, ok := netip.AddrFromSlice(ipn.IP.To4()); ok {
					return a, nil
				}
			}
		}
	}
	return netip.MustParseAddr("127.0.0.1"), nil
}

// port is the port actually listened on (Config.Port may be 0 in tests).
func (s *Server) port() int { return s.listener.Addr().(*net.TCPAddr).Port }

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.listener.Addr() }

// URL is the server's base URL for clients on this machine (the admin
// kubeconfig, the built-in agent): loopback when it listens on every
// address, else the address it listens on (--bind-address), as k3s
// writes it; loopback would not answer.
func (s *Server) URL() string {
	addr := s.listener.Addr().(*net.TCPAddr)
	host := "127.0.0.1"
	if !addr.IP.IsUnspecified() {
		host = addr.IP.String()
	}
	return "https://" + net.JoinHostPort(host, strconv.Itoa(addr.Port))
}

// CACert is the cluster CA's certificate (PEM), which signs the API's
// serving certificate, then, after a rotation, the CA still trusted.
func (s *Server) CACert() []byte { return s.ca().Bundle() }

func (s *Server) ca() *pki.CA { return s.authority.Load() }

// Token is the join token.
func (s *Server) Token() string {
	s.tokenMu.Lock()
	defer s.tokenMu.Unlock()
	return s.token
}

// Run serves until ctx ends, then shuts down and closes the store.
func (s *Server) Run(ctx context.Context) error {
	srv := &http.Server{
		Handler: s.handler,
		TLSConfig: &tls.Config{
			MinVersion: tls.VersionTLS12,
			// Renewed while serving (certificates.go).
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.serving.Load(), nil },
			// Asked for, and checked at each request against the CAs of
			// the moment (auth.Authenticator.VerifyClient), as
			// kube-apiserver does: a certificate no CA signed is a 401.
			ClientAuth: tls.RequestClientCert,
		},
		// Many watches share one client connection over HTTP/2; 250 streams
		// (Go's default, a quarter of kube-apiserver's) bound what one
		// connection's rapid resets can keep busy.
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: 250},
		// A connection has 10 s for its TLS handshake and each request's
		// headers (slowloris), and is closed after 90 s without a request.
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       90 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	// The watch caches start before the first request can ask for one.
	caches, stopCaches := context.WithCancel(ctx)
	defer stopCaches()
	if !s.cfg.DisableWatchCache {
		s.caches.Store(&caches)
		for _, st := range s.catalog.Load().Storages {
			st.EnableCache(caches, s.log)
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(limitPerSource(s.listener, s.cfg.MaxConnectionsPerSource), "", "") }()
	ttl := s.eventTTL()
	sweepEvery := min(ttl/4, time.Minute)
	if s.sharedStore() {
		// etcd deletes events itself (their keys are on leases); the sweep
		// only finds those written without one (moved from bbolt).
		sweepEvery = ttl
	}
	expiry, stopExpiry := context.WithCancel(ctx)
	defer stopExpiry()
	go s.expireEvents(expiry, ttl, sweepEvery)
	s.followAdmission(expiry)
	go follow(expiry, s.storage("", "pods"), s.graph, s.log)
	go follow(expiry, s.storage("", "persistentvolumeclaims"), s.claimVolumes, s.log)
	go follow(expiry, s.storage("networking.k8s.io", "ingresses"), s.ingressSecrets, s.log)
	go follow(expiry, s.storage("networking.k8s.io", "ingressclasses"), s.ingressSecrets.Classes(), s.log)
	go followSelected(expiry, s.storage("", "configmaps"), gatewayapi.ConfigNamespace, "metadata.name="+gatewayapi.ConfigName, s.gatewaySecrets, s.log)
	go follow(expiry, s.storage("", "serviceaccounts"), s.accounts, s.log)
	s.followRBAC(expiry)
	// Stored CustomResourceDefinitions are served before the first request.
	defs := newDefinitions(s)
	if err := defs.syncAll(ctx); err != nil {
		return err
	}
	go follow(expiry, defs.st, defs, s.log)
	go defs.work(expiry)
	if err := s.startSnapshots(expiry); err != nil {
		return err
	}
	go s.usage.Run(expiry)
	s.runAggregation(expiry)
	go s.renewCertificates(expiry, cmp.Or(s.cfg.CertificateCheckInterval, 12*time.Hour))
	listed := make(chan struct{})
	listing, stopListing := context.WithCancel(expiry)
	defer stopListing()
	if s.sharedStore() {
		go func() {
			defer close(listed)
			s.keepAPIServerListed(listing)
		}()
	} else {
		close(listed)
	}
	if s.cfg.NodeName != "" {
		go s.markControlPlane(expiry)
	}
	if err := s.serveControlSocket(expiry); err != nil {
		// orch snapshot save and orch token rotate need it; serving does not.
		s.log.Warn("orch's commands cannot reach this server", "err", err)
	}
	var memberDone <-chan struct{}
	if s.member != nil {
		memberDone = s.member.Done()
		go s.member.ManageLearners(expiry, 5*time.Second)
		go s.manageMembers(expiry, cmp.Or(s.cfg.MemberCheckInterval, 5*time.Second))
	}
	s.ready.Store(true)
	s.log.Info("API server listening", "url", s.URL(), "advertise", s.advertise.String())
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	case <-memberDone:
		err = s.memberStopped()
	}
	s.ready.Store(false)
	// Out of the kubernetes Service first, while the datastore is open.
	stopListing()
	<-listed
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// No new connections; the requests being served finish (within 5 s).
	// Then the rest is closed: an idle HTTP/2 connection, which Shutdown
	// would give a second to go after its GOAWAY, and the watches.
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = srv.Shutdown(shutdown)
	}()
	s.inFlight.drained(shutdown)
	_ = srv.Close()
	<-stopped
	stopExpiry()
	stopCaches()
	if cerr := s.store.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if s.member != nil {
		s.member.Close()
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func (s *Server) buildHandler() (http.Handler, error) {
	var err error
	if s.authn, err = auth.NewAuthenticator(s.cfg.TokenAuthFile, s, s.issuer.APIAudiences); err != nil {
		return nil, err
	}
	s.authn.VerifyClient = func(chain []*x509.Certificate) (*x509.Certificate, error) { return s.ca().VerifyClient(chain) }
	api := http.NewServeMux()
	s.serveIssuerDiscovery(api)
	api.Handle("/", s.aggregator.Handler(rest.New(s.catalog, rest.Options{BookmarkInterval: s.cfg.BookmarkInterval, Version: kubeversion.Info(s.cfg.Version), Logger: s.log, Kubelets: s.kubelets,
		DialPod: s.podDial.DialContext, Aggregated: s.aggregatedGroupVersions}), rest.WriteError))
	docs := s.aggregator.OpenAPIHandler(openapi.NewHandler(s.catalog).WithAggregated(s.aggregatedOpenAPI), rest.WriteError)
	api.Handle("/openapi/v2", openapi.NewV2Handler(s.catalog))
	api.Handle("/openapi/v3", docs)
	api.Handle("/openapi/v3/", docs)
	api.Handle("GET /metrics", metrics.Handler(s.metrics.registry))
	if !s.cfg.DisableProfiling {
		api.Handle("GET /debug/pprof/", profilingHandler())
	}
	api.HandleFunc("GET "+upgradeapi.ReleasesPath, s.serveRelease)
	return s.routes(api, s.authn, s.authz), nil
}

// CompactStore forgets all history before the current revision, as
// `etcdctl compact` does; watches from older resourceVersions get 410.
func (s *Server) CompactStore(ctx context.Context) error {
	rev, err := s.store.Revision(ctx)
	if err != nil {
		return err
	}
	return s.store.Compact(ctx, rev)
}

// Serve adds a resource to what the API serves while it runs, as a
// CustomResourceDefinition does: routing, discovery and the OpenAPI
// documents follow from the next request on. Its objects cannot live in
// the store's memory tier, which is fixed when the store opens.
func (s *Server) Serve(r *resources.Resource) error {
	if len(r.Volatile) > 0 {
		return fmt.Errorf("serve %s: a resource added at run time cannot be volatile", r.GroupResource())
	}
	st := registry.New(s.store, r)
	st.Admit = s.admission.For(r)
	if ctx := s.caches.Load(); ctx != nil {
		st.EnableCache(*ctx, s.log)
	}
	return s.catalog.Add(st)
}

// Unserve stops serving a resource; its stored objects stay, and watches
// already open run until they end.
func (s *Server) Unserve(gvr schema.GroupVersionResource) { s.catalog.Remove(gvr) }
