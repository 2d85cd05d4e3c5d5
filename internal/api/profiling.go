package api

import (
	"fmt"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

// maxCPUProfile bounds /debug/pprof/profile's seconds: a profile holds a
// connection and costs CPU while it runs.
const maxCPUProfile = 5 * time.Minute

// profilingHandler serves the process's profiles at /debug/pprof/, as
// kube-apiserver does with --profiling (its default): `kubectl get --raw
// /debug/pprof/heap > heap.pb.gz`, then `go tool pprof`. Only who may get
// the non-resource URL may read them (cluster-admin: what a heap shows is
// the cluster's business). Written over runtime/pprof rather than with
// net/http/pprof, whose index page pulls html/template into the binary.
func profilingHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/debug/pprof/")
		switch name {
		case "":
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			var index strings.Builder
			index.WriteString("profiles (GET /debug/pprof/NAME, ?debug=1 for text; profile?seconds=N for CPU):\n")
			for _, p := range pprof.Profiles() {
				fmt.Fprintf(&index, "%d\t%s\n", p.Count(), p.Name())
			}
			index.WriteString("-\tprofile\n")
			_, _ = w.Write([]byte(index.String()))
		case "profile":
			cpuProfile(w, r)
		default:
			p := pprof.Lookup(name)
			if p == nil {
				http.Error(w, fmt.Sprintf("no profile %q (GET /debug/pprof/ lists them)", name), http.StatusNotFound)
				return
			}
			debug, _ := strconv.Atoi(r.URL.Query().Get("debug"))
			if name == "heap" && r.URL.Query().Get("gc") != "" {
				runtime.GC()
			}
			setProfileHeaders(w, name, debug)
			if err := p.WriteTo(w, debug); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		}
	})
}

func cpuProfile(w http.ResponseWriter, r *http.Request) {
	seconds := int64(30)
	if v := r.URL.Query().Get("seconds"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || time.Duration(n)*time.Second > maxCPUProfile {
			http.Error(w, fmt.Sprintf("seconds must be a whole number from 1 to %d", int64(maxCPUProfile/time.Second)), http.StatusBadRequest)
			return
		}
		seconds = n
	}
	setProfileHeaders(w, "profile", 0) // before the profiler's first write
	if err := pprof.StartCPUProfile(w); err != nil {
		// One CPU profile at a time, in the whole process.
		w.Header().Del("Content-Disposition")
		http.Error(w, "a CPU profile is already being taken: "+err.Error(), http.StatusConflict)
		return
	}
	select {
	case <-time.After(time.Duration(seconds) * time.Second):
	case <-r.Context().Done():
	}
	pprof.StopCPUProfile()
}

func setProfileHeaders(w http.ResponseWriter, name string, debug int) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if debug != 0 {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s"`, name))
}
