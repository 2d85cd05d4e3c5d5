// Package logindtest runs a system bus for tests (the real dbus-daemon,
// on a socket of the test's own) with a stand-in systemd-logind on it:
// the parts of login1.Manager the agent uses (Inhibit with delay locks,
// InhibitDelayMaxUSec, the PrepareForShutdown signal) and systemd's
// KillUnit, through which a SIGHUP makes it read its logind.conf.d again.
// The machines tests run on have no logind: it needs systemd as PID 1.
package logindtest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/prop"
)

const (
	logindInterface  = "org.freedesktop.login1.Manager"
	logindObject     = dbus.ObjectPath("/org/freedesktop/login1")
	systemdInterface = "org.freedesktop.systemd1.Manager"
	systemdObject    = dbus.ObjectPath("/org/freedesktop/systemd1")
)

// busConfig is a bus anyone on the machine may use and own names on.
const busConfig = `<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=%s</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
`

// Logind is the stand-in logind and the bus it is on.
type Logind struct {
	// Address is the bus's D-Bus address.
	Address string
	// ConfDir is the logind.conf.d it reads on SIGHUP.
	ConfDir string

	conn  *dbus.Conn
	props *prop.Properties

	// stop ends the locks' goroutines (wg) when the test ends.
	stop chan struct{}
	wg   sync.WaitGroup

	mu sync.Mutex
	// readEnds are logind's ends of the locks' pipes.
	readEnds []*os.File
	// held counts the delay locks whose holders have not closed them.
	held    int
	taken   int
	reloads int
	// whys are the reasons given with each lock taken.
	whys []string
}

// Start runs a bus and a stand-in logind allowing delay locks of delay
// until the test ends. It skips the test on a machine without
// dbus-daemon (scripts/test.sh installs it).
func Start(t testing.TB, delay time.Duration) *Logind {
	t.Helper()
	daemon, err := exec.LookPath("dbus-daemon")
	if err != nil {
		t.Skip("no dbus-daemon (package dbus-daemon)")
	}
	dir := t.TempDir()
	socket := filepath.Join(dir, "system_bus_socket")
	conf := filepath.Join(dir, "bus.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(busConfig, socket)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(daemon, "--config-file="+conf, "--nofork", "--nopidfile", "--print-address")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	address, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("dbus-daemon printed no address: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	l := &Logind{Address: strings.TrimSpace(address), ConfDir: filepath.Join(dir, "logind.conf.d"), stop: make(chan struct{})}
	t.Cleanup(func() {
		close(l.stop)
		l.mu.Lock()
		for _, r := range l.readEnds {
			_ = r.Close()
		}
		l.mu.Unlock()
		l.wg.Wait()
	})
	conn, err := dbus.Connect(l.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	l.conn = conn
	for _, name := range []string{"org.freedesktop.login1", "org.freedesktop.systemd1"} {
		if reply, err := conn.RequestName(name, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
			t.Fatalf("owning %s on the test bus: %v %v", name, reply, err)
		}
	}
	if err := conn.Export(logindManager{l}, logindObject, logindInterface); err != nil {
		t.Fatal(err)
	}
	if err := conn.Export(systemdManager{l}, systemdObject, systemdInterface); err != nil {
		t.Fatal(err)
	}
	l.props, err = prop.Export(conn, logindObject, prop.Map{logindInterface: {
		"InhibitDelayMaxUSec": {Value: uint64(delay / time.Microsecond), Emit: prop.EmitFalse},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// PrepareForShutdown emits logind's signal: true as the machine begins to
// shut down, false when that is cancelled.
func (l *Logind) PrepareForShutdown(t testing.TB, start bool) {
	t.Helper()
	if err := l.conn.Emit(logindObject, logindInterface+".PrepareForShutdown", start); err != nil {
		t.Fatal(err)
	}
}

// Held is how many delay locks are held now; Taken how many were ever.
func (l *Logind) Held() (held, taken int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held, l.taken
}

// Holders are who took each lock and why, in order.
func (l *Logind) Holders() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.whys...)
}

// Reloads is how many times logind was told to read its configuration.
func (l *Logind) Reloads() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reloads
}

// Delay is the InhibitDelayMaxUSec logind allows now.
func (l *Logind) Delay() time.Duration {
	v, err := l.props.Get(logindInterface, "InhibitDelayMaxUSec")
	if err != nil {
		return 0
	}
	return time.Duration(v.Value().(uint64)) * time.Microsecond
}

// holderClosesAfter is how long the stand-in keeps its copy of a lock's
// descriptor: past the reply that hands it over (godbus sends after the
// method returns), after which only the holder keeps the lock.
const holderClosesAfter = time.Second

type logindManager struct{ l *Logind }

// Inhibit hands out a lock as logind does: one end of a pipe whose other
// end logind watches; the lock ends when every copy is closed.
func (m logindManager) Inhibit(what, who, why, mode string) (dbus.UnixFD, *dbus.Error) {
	if what != "shutdown" || mode != "delay" {
		return 0, dbus.MakeFailedError(fmt.Errorf("the stand-in logind takes shutdown delay locks only, not %s %s", what, mode))
	}
	r, w, err := os.Pipe()
	if err != nil {
		return 0, dbus.MakeFailedError(err)
	}
	fd := w.Fd()
	l := m.l
	l.mu.Lock()
	l.held++
	l.taken++
	l.whys = append(l.whys, who+": "+why)
	l.readEnds = append(l.readEnds, r)
	l.mu.Unlock()
	l.wg.Go(func() {
		select {
		case <-time.After(holderClosesAfter):
		case <-l.stop:
		}
		_ = w.Close()
	})
	l.wg.Go(func() {
		_, _ = io.Copy(io.Discard, r) // until every writer closed it
		l.mu.Lock()
		l.held--
		l.mu.Unlock()
	})
	return dbus.UnixFD(fd), nil
}

type systemdManager struct{ l *Logind }

// KillUnit: a SIGHUP to systemd-logind.service makes it read its
// drop-ins again.
func (m systemdManager) KillUnit(unit, who string, signal int32) *dbus.Error {
	if unit != "systemd-logind.service" || syscall.Signal(signal) != syscall.SIGHUP {
		return dbus.MakeFailedError(fmt.Errorf("the stand-in systemd only reloads logind, not %s %d", unit, signal))
	}
	l := m.l
	l.mu.Lock()
	l.reloads++
	l.mu.Unlock()
	entries, err := os.ReadDir(l.ConfDir)
	if err != nil {
		return dbus.MakeFailedError(err)
	}
	for _, e := range entries {
		body, err := os.ReadFile(filepath.Join(l.ConfDir, e.Name()))
		if err != nil {
			return dbus.MakeFailedError(err)
		}
		for line := range strings.Lines(string(body)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "InhibitDelayMaxSec="); ok {
				seconds, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return dbus.MakeFailedError(err)
				}
				l.props.SetMust(logindInterface, "InhibitDelayMaxUSec", seconds*uint64(time.Second/time.Microsecond))
			}
		}
	}
	return nil
}
