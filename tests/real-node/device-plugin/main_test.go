package main

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pb "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestParseDeviceList(t *testing.T) {
	ok := []struct {
		name string
		body string
		want []string
	}{
		{"empty", `[]`, []string{}},
		{"empty with whitespace", " [ ]\n", []string{}},
		{"one", `[{"uuid":"GPU-a","minor":0,"bus":"00000000:3B:00.0"}]`, []string{"GPU-a"}},
		// Sorted, so that the service reordering its answer is not a change.
		{"sorted", `[{"uuid":"GPU-b","minor":1,"bus":"x"},{"uuid":"GPU-a","minor":0,"bus":"y"}]`, []string{"GPU-a", "GPU-b"}},
		// Extra fields are tolerated so the service can grow without breaking the plugin.
		{"extra fields", `[{"uuid":"GPU-a","minor":0,"bus":"x","model":"H100"}]`, []string{"GPU-a"}},
	}
	for _, c := range ok {
		got, err := parseDeviceList([]byte(c.body))
		if err != nil {
			t.Errorf("%s: unexpected error %v", c.name, err)
			continue
		}
		if !slices.Equal(got, c.want) || got == nil {
			t.Errorf("%s: got %#v, want %#v", c.name, got, c.want)
		}
	}

	bad := []struct{ name, body, wantInErr string }{
		{"null", `null`, "expected a JSON array"},
		{"object", `{"gpus":[]}`, "expected a JSON array"},
		{"html", `<html>oops</html>`, "expected a JSON array"},
		{"truncated", `[{"uuid":"GPU-a"`, "bad JSON"},
		{"wrong type", `[{"uuid":7}]`, "bad JSON"},
		{"trailing garbage", `[] []`, "bad JSON"},
		{"no uuid", `[{"minor":0,"bus":"x"}]`, "no uuid"},
		{"duplicate", `[{"uuid":"GPU-a"},{"uuid":"GPU-a"}]`, "twice"},
	}
	for _, c := range bad {
		if _, err := parseDeviceList([]byte(c.body)); err == nil || !strings.Contains(err.Error(), c.wantInErr) {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.wantInErr)
		}
	}
}

func TestDiffIDs(t *testing.T) {
	cases := []struct {
		old, cur, added, removed []string
	}{
		{nil, nil, nil, nil},
		{[]string{}, []string{"a"}, []string{"a"}, nil},
		{[]string{"a"}, []string{}, nil, []string{"a"}},
		{[]string{"a", "b"}, []string{"a", "b"}, nil, nil},
		{[]string{"a", "c", "e"}, []string{"b", "c", "d"}, []string{"b", "d"}, []string{"a", "e"}},
	}
	for _, c := range cases {
		added, removed := diffIDs(c.old, c.cur)
		if !slices.Equal(added, c.added) || !slices.Equal(removed, c.removed) {
			t.Errorf("diffIDs(%v, %v) = %v, %v; want %v, %v", c.old, c.cur, added, removed, c.added, c.removed)
		}
	}
}

func TestDeviceStoreWakesWatchersOnlyOnChange(t *testing.T) {
	s := newDeviceStore()
	_, ch := s.snapshot()
	if a, r := s.set([]string{}); a != nil || r != nil {
		t.Fatalf("setting the same empty list reported a change: %v %v", a, r)
	}
	select {
	case <-ch:
		t.Fatal("watcher woken without a change")
	default:
	}
	s.set([]string{"GPU-a"})
	select {
	case <-ch:
	default:
		t.Fatal("watcher not woken by a change")
	}
	ids, _ := s.snapshot()
	if !slices.Equal(ids, []string{"GPU-a"}) {
		t.Fatalf("snapshot %v", ids)
	}
}

func TestAllocateResponse(t *testing.T) {
	known := map[string]bool{"GPU-a": true, "GPU-b": true, "GPU-c": true}
	req := &pb.AllocateRequest{ContainerRequests: []*pb.ContainerAllocateRequest{
		{DevicesIds: []string{"GPU-c", "GPU-a"}},
		{DevicesIds: []string{"GPU-b"}},
	}}
	resp, err := allocateResponse(req, known)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ContainerResponses) != 2 {
		t.Fatalf("got %d container responses", len(resp.ContainerResponses))
	}
	// The kubelet's order is kept, as NVIDIA's plugin does.
	if got := resp.ContainerResponses[0].Envs["NVIDIA_VISIBLE_DEVICES"]; got != "GPU-c,GPU-a" {
		t.Errorf("first container: NVIDIA_VISIBLE_DEVICES=%q", got)
	}
	if got := resp.ContainerResponses[1].Envs["NVIDIA_VISIBLE_DEVICES"]; got != "GPU-b" {
		t.Errorf("second container: NVIDIA_VISIBLE_DEVICES=%q", got)
	}

	_, err = allocateResponse(&pb.AllocateRequest{ContainerRequests: []*pb.ContainerAllocateRequest{
		{DevicesIds: []string{"GPU-a", "GPU-zzz"}},
	}}, known)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "GPU-zzz") {
		t.Errorf("unknown device: got %v, want InvalidArgument naming GPU-zzz", err)
	}
}

func TestConfigFromEnv(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

	if _, err := configFromEnv(env(nil)); err == nil ||
		!strings.Contains(err.Error(), "CRO_STANDIN_URL") || !strings.Contains(err.Error(), "NODE_NAME") {
		t.Errorf("missing both: %v", err)
	}
	if _, err := configFromEnv(env(map[string]string{"CRO_STANDIN_URL": "127.0.0.1:1", "NODE_NAME": "n"})); err == nil {
		t.Error("a URL without scheme was accepted")
	}
	cfg, err := configFromEnv(env(map[string]string{"CRO_STANDIN_URL": "http://127.0.0.1:41234/", "NODE_NAME": "127.0.0.1"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.listURL != "http://127.0.0.1:41234/v1/nodes/127.0.0.1/gpus" {
		t.Errorf("listURL %q", cfg.listURL)
	}
	if cfg.resourceName != "nvidia.com/gpu" || cfg.socketPath() != "/var/lib/kubelet/device-plugins/cro-standin-gpu.sock" {
		t.Errorf("defaults: %q %q", cfg.resourceName, cfg.socketPath())
	}
}
