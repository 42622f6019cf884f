// Command cro-standin-device-plugin is a real Kubernetes device plugin (API v1beta1) for
// the real-node test tier. The GPUs are simulated: the test process runs a stand-in
// service that knows which GPUs the fabric simulator has attached to this node, and this
// plugin advertises exactly those to the kubelet, so that the kubelet itself puts the
// resource into the node's capacity and admits Pods that request it — the same path a
// production node takes with NVIDIA's plugin.
//
// Environment:
//
//	CRO_STANDIN_URL        base URL of the stand-in service (required)
//	NODE_NAME              this node's name (required)
//	CRO_DEVICE_PLUGIN_DIR  kubelet's device-plugin directory (default /var/lib/kubelet/device-plugins/)
//	CRO_RESOURCE_NAME      extended resource to advertise (default nvidia.com/gpu)
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pb "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	socketName        = "cro-standin-gpu.sock"
	kubeletSocketName = "kubelet.sock"
	visibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"

	pollInterval   = 500 * time.Millisecond
	watchInterval  = time.Second
	retryInterval  = time.Second
	httpTimeout    = 2 * time.Second
	rpcTimeout     = 5 * time.Second
	maxBodyBytes   = 1 << 20
	errorLogRepeat = 30 * time.Second
)

type config struct {
	listURL      string
	dir          string
	resourceName string
}

func (c config) socketPath() string        { return filepath.Join(c.dir, socketName) }
func (c config) kubeletSocketPath() string { return filepath.Join(c.dir, kubeletSocketName) }

// configFromEnv returns a message meant for a person on failure, since a missing variable
// is a mistake in the harness rather than something to retry.
func configFromEnv(getenv func(string) string) (config, error) {
	var missing []string
	base := strings.TrimSpace(getenv("CRO_STANDIN_URL"))
	node := strings.TrimSpace(getenv("NODE_NAME"))
	if base == "" {
		missing = append(missing, "CRO_STANDIN_URL (base URL of the stand-in service, e.g. http://127.0.0.1:41234)")
	}
	if node == "" {
		missing = append(missing, "NODE_NAME (the name of this node, e.g. 127.0.0.1)")
	}
	if len(missing) > 0 {
		return config{}, fmt.Errorf("missing required environment: %s", strings.Join(missing, "; "))
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return config{}, fmt.Errorf("CRO_STANDIN_URL=%q is not an http(s) URL with a host", base)
	}
	dir := getenv("CRO_DEVICE_PLUGIN_DIR")
	if dir == "" {
		dir = pb.DevicePluginPath
	}
	// The gRPC unix resolver wants an absolute path, and logs read better with one.
	if dir, err = filepath.Abs(dir); err != nil {
		return config{}, fmt.Errorf("CRO_DEVICE_PLUGIN_DIR: %v", err)
	}
	res := getenv("CRO_RESOURCE_NAME")
	if res == "" {
		res = "nvidia.com/gpu"
	}
	return config{
		listURL:      strings.TrimRight(base, "/") + "/v1/nodes/" + url.PathEscape(node) + "/gpus",
		dir:          dir,
		resourceName: res,
	}, nil
}

// gpu is one entry of the stand-in service's answer. Only the UUID is used as the device
// ID (as NVIDIA's plugin does by default); minor and bus are parsed so that a malformed
// answer is noticed rather than half-trusted.
type gpu struct {
	UUID  string `json:"uuid"`
	Minor int    `json:"minor"`
	Bus   string `json:"bus"`
}

// parseDeviceList returns the device IDs, sorted, so that a reordering by the service is
// not reported to the kubelet as a change.
func parseDeviceList(body []byte) ([]string, error) {
	trimmed := strings.TrimSpace(string(body))
	// json.Unmarshal accepts null into a slice; the contract is an array, and a null
	// more likely means a bug on the other side than "no GPUs".
	if !strings.HasPrefix(trimmed, "[") {
		return nil, fmt.Errorf("expected a JSON array, got %q", truncate(trimmed, 80))
	}
	var gpus []gpu
	if err := json.Unmarshal(body, &gpus); err != nil {
		return nil, fmt.Errorf("bad JSON: %v", err)
	}
	ids := make([]string, 0, len(gpus))
	seen := make(map[string]bool, len(gpus))
	for i, g := range gpus {
		if g.UUID == "" {
			return nil, fmt.Errorf("entry %d has no uuid", i)
		}
		if seen[g.UUID] {
			return nil, fmt.Errorf("uuid %s listed twice", g.UUID)
		}
		seen[g.UUID] = true
		ids = append(ids, g.UUID)
	}
	slices.Sort(ids)
	return ids, nil
}

// diffIDs takes two sorted lists.
func diffIDs(old, cur []string) (added, removed []string) {
	i, j := 0, 0
	for i < len(old) || j < len(cur) {
		switch {
		case j == len(cur) || (i < len(old) && old[i] < cur[j]):
			removed = append(removed, old[i])
			i++
		case i == len(old) || cur[j] < old[i]:
			added = append(added, cur[j])
			j++
		default:
			i++
			j++
		}
	}
	return added, removed
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// deviceStore holds the last good device list. A change closes the current channel and
// replaces it, so any number of ListAndWatch streams wake without a registry of them.
type deviceStore struct {
	mu      sync.Mutex
	ids     []string
	changed chan struct{}
}

func newDeviceStore() *deviceStore {
	return &deviceStore{ids: []string{}, changed: make(chan struct{})}
}

func (s *deviceStore) snapshot() ([]string, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ids, s.changed
}

func (s *deviceStore) set(ids []string) (added, removed []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	added, removed = diffIDs(s.ids, ids)
	if len(added) == 0 && len(removed) == 0 {
		return nil, nil
	}
	s.ids = ids
	close(s.changed)
	s.changed = make(chan struct{})
	return added, removed
}

func (s *deviceStore) known() map[string]bool {
	ids, _ := s.snapshot()
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// poller keeps the store in step with the stand-in service. Errors never change the
// store: a service that restarts or hiccups must not make GPUs vanish from the node,
// which would look to the operator like a real detach.
type poller struct {
	url    string
	client *http.Client
	store  *deviceStore

	lastErr   string
	lastErrAt time.Time
	gotList   bool
}

func (p *poller) fetch(ctx context.Context) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBodyBytes))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, truncate(strings.TrimSpace(string(body)), 200))
	}
	return parseDeviceList(body)
}

func (p *poller) pollOnce(ctx context.Context) {
	ids, err := p.fetch(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		// Every 500 ms while the service is down would drown the interesting lines.
		msg := err.Error()
		if msg != p.lastErr || time.Since(p.lastErrAt) >= errorLogRepeat {
			log.Printf("error: device list from %s: %s (keeping the last list)", p.url, msg)
			p.lastErr, p.lastErrAt = msg, time.Now()
		}
		return
	}
	if p.lastErr != "" {
		log.Printf("stand-in service answers again")
		p.lastErr = ""
	}
	added, removed := p.store.set(ids)
	if !p.gotList {
		// The store starts empty, so an empty first list would otherwise go unlogged.
		p.gotList = true
		log.Printf("device list: %d device(s) %v", len(ids), ids)
	} else if added != nil || removed != nil {
		log.Printf("device list changed: %d device(s) %v (added %v, removed %v)", len(ids), ids, added, removed)
	}
}

func (p *poller) run(ctx context.Context) {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.pollOnce(ctx)
		}
	}
}

// plugin is the DevicePlugin service. It is stateless apart from the shared store, so a
// fresh server after a kubelet restart can reuse it.
type plugin struct {
	pb.UnimplementedDevicePluginServer
	store *deviceStore
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pb.Empty) (*pb.DevicePluginOptions, error) {
	return &pb.DevicePluginOptions{}, nil
}

func toDevices(ids []string) []*pb.Device {
	devs := make([]*pb.Device, len(ids))
	for i, id := range ids {
		devs[i] = &pb.Device{ID: id, Health: pb.Healthy}
	}
	return devs
}

func (p *plugin) ListAndWatch(_ *pb.Empty, stream grpc.ServerStreamingServer[pb.ListAndWatchResponse]) error {
	ids, changed := p.store.snapshot()
	for {
		if err := stream.Send(&pb.ListAndWatchResponse{Devices: toDevices(ids)}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			// The kubelet went away or the server is stopping; it reconnects on its own.
			return nil
		case <-changed:
			ids, changed = p.store.snapshot()
		}
	}
}

func (p *plugin) GetPreferredAllocation(context.Context, *pb.PreferredAllocationRequest) (*pb.PreferredAllocationResponse, error) {
	return &pb.PreferredAllocationResponse{}, nil
}

func (p *plugin) Allocate(_ context.Context, req *pb.AllocateRequest) (*pb.AllocateResponse, error) {
	resp, err := allocateResponse(req, p.store.known())
	if err != nil {
		log.Printf("error: Allocate: %v", err)
	}
	return resp, err
}

// allocateResponse keeps the kubelet's order of device IDs, as NVIDIA's plugin does with
// its default envvar strategy, so the container sees the same string in both worlds.
func allocateResponse(req *pb.AllocateRequest, known map[string]bool) (*pb.AllocateResponse, error) {
	resp := &pb.AllocateResponse{}
	for _, cr := range req.GetContainerRequests() {
		ids := cr.GetDevicesIds()
		if len(ids) == 0 {
			return nil, status.Error(codes.InvalidArgument, "a container request names no device")
		}
		for _, id := range ids {
			if !known[id] {
				return nil, status.Errorf(codes.InvalidArgument, "unknown device %q: not attached to this node", id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pb.ContainerAllocateResponse{
			Envs: map[string]string{visibleDevicesEnv: strings.Join(ids, ",")},
		})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pb.PreStartContainerRequest) (*pb.PreStartContainerResponse, error) {
	return &pb.PreStartContainerResponse{}, nil
}

// serving is one incarnation of the gRPC server. identity is the socket file as created,
// so that a file someone else put at the same path counts as our socket being gone.
type serving struct {
	srv      *grpc.Server
	identity os.FileInfo
	done     chan struct{}
}

func startServer(cfg config, p *plugin) (*serving, error) {
	path := cfg.socketPath()
	// A socket left by a previous run makes Listen fail with "address already in use".
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing stale %s: %v", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		lis.Close()
		return nil, err
	}
	s := &serving{srv: grpc.NewServer(), identity: fi, done: make(chan struct{})}
	pb.RegisterDevicePluginServer(s.srv, p)
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(lis); err != nil {
			log.Printf("error: gRPC server on %s: %v", path, err)
		}
	}()
	return s, nil
}

func (s *serving) stop() {
	// Stop, not GracefulStop: ListAndWatch streams never end by themselves.
	s.srv.Stop()
	<-s.done
}

// socketIntact reports whether the file at path is still the one we created. The kubelet
// deletes every socket in the directory when it starts, which is the only notice a
// plugin gets that it must register again.
func socketIntact(path string, identity os.FileInfo) bool {
	fi, err := os.Stat(path)
	return err == nil && os.SameFile(fi, identity)
}

func register(ctx context.Context, cfg config) error {
	conn, err := grpc.NewClient("unix://"+cfg.kubeletSocketPath(),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	_, err = pb.NewRegistrationClient(conn).Register(ctx, &pb.RegisterRequest{
		Version:      pb.Version,
		Endpoint:     socketName,
		ResourceName: cfg.resourceName,
		Options: &pb.DevicePluginOptions{
			GetPreferredAllocationAvailable: false,
			PreStartRequired:                false,
		},
	})
	return err
}

// sleepCtx returns false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// registerAndWatch registers (retrying) and then watches until the server must be
// rebuilt. It returns the reason, or "" when ctx ended.
func registerAndWatch(ctx context.Context, cfg config, s *serving) string {
	var kubeletIdentity os.FileInfo
	registered := false
	failures := 0
	for {
		if !registered {
			if err := register(ctx, cfg); err != nil {
				if ctx.Err() != nil {
					return ""
				}
				failures++
				// The kubelet may be down for minutes during a test; a line per second
				// would bury everything else.
				if failures <= 3 || failures%30 == 0 {
					log.Printf("error: Register with %s failed (attempt %d, retrying every %s): %v",
						cfg.kubeletSocketPath(), failures, retryInterval, err)
				}
			} else {
				registered = true
				kubeletIdentity, _ = os.Stat(cfg.kubeletSocketPath())
				log.Printf("registered %s with the kubelet (endpoint %s, after %d failed attempt(s))",
					cfg.resourceName, socketName, failures)
			}
		}
		interval := watchInterval
		if !registered {
			interval = retryInterval
		}
		if !sleepCtx(ctx, interval) {
			return ""
		}
		if !socketIntact(cfg.socketPath(), s.identity) {
			return "our socket " + cfg.socketPath() + " was removed (kubelet restart?)"
		}
		// A kubelet that restarted without clearing the directory would otherwise never
		// learn about us; a new kubelet.sock is the sign.
		if registered && kubeletIdentity != nil {
			fi, err := os.Stat(cfg.kubeletSocketPath())
			if err == nil && !os.SameFile(fi, kubeletIdentity) {
				return "kubelet.sock was re-created"
			}
		}
	}
}

func run(ctx context.Context, cfg config, store *deviceStore) {
	p := &plugin{store: store}
	startFailures := 0
	for {
		s, err := startServer(cfg, p)
		if err != nil {
			startFailures++
			if startFailures <= 3 || startFailures%30 == 0 {
				log.Printf("error: serving on %s (attempt %d): %v", cfg.socketPath(), startFailures, err)
			}
			if !sleepCtx(ctx, retryInterval) {
				return
			}
			continue
		}
		startFailures = 0
		log.Printf("serving DevicePlugin on %s", cfg.socketPath())
		reason := registerAndWatch(ctx, cfg, s)
		s.stop()
		if reason == "" {
			return
		}
		log.Printf("re-registering: %s", reason)
	}
}

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("cro-standin-device-plugin: ")
	log.SetOutput(os.Stderr)

	cfg, err := configFromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cro-standin-device-plugin: %v\n", err)
		os.Exit(2)
	}
	log.Printf("started: resource %s, device list from %s, plugin dir %s", cfg.resourceName, cfg.listURL, cfg.dir)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	store := newDeviceStore()
	pl := &poller{url: cfg.listURL, client: &http.Client{Timeout: httpTimeout}, store: store}
	// One poll before serving, so the kubelet's first list is the real one when the
	// service is already up rather than an empty list followed by a change.
	pl.pollOnce(ctx)
	go pl.run(ctx)

	run(ctx, cfg, store)

	if err := os.Remove(cfg.socketPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Printf("error: removing %s: %v", cfg.socketPath(), err)
	}
	log.Printf("stopped")
}
