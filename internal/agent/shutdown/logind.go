package shutdown

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/orch-dev/orch/internal/atomicfile"
)

// systemd-logind's D-Bus names, as the kubelet uses them.
const (
	logindService   = "org.freedesktop.login1"
	logindObject    = dbus.ObjectPath("/org/freedesktop/login1")
	logindInterface = "org.freedesktop.login1.Manager"

	systemdService   = "org.freedesktop.systemd1"
	systemdObject    = dbus.ObjectPath("/org/freedesktop/systemd1")
	systemdInterface = "org.freedesktop.systemd1.Manager"
)

// DropInName is the logind.conf drop-in the agent writes to raise
// InhibitDelayMaxSec (logind's default is 5 s) to its grace period, as the
// kubelet writes 99-kubelet.conf.
const DropInName = "99-orch.conf"

// logind talks to systemd-logind over the system bus.
type logind struct {
	conn *dbus.Conn
}

// connectLogind connects to the bus at address, or to the machine's
// system bus (DBUS_SYSTEM_BUS_ADDRESS, else /run/dbus/system_bus_socket).
func connectLogind(ctx context.Context, address string) (*logind, error) {
	var conn *dbus.Conn
	var err error
	if address == "" {
		conn, err = dbus.ConnectSystemBus(dbus.WithContext(ctx))
	} else {
		conn, err = dbus.Connect(address, dbus.WithContext(ctx))
	}
	if err != nil {
		return nil, fmt.Errorf("system bus: %w", err)
	}
	return &logind{conn: conn}, nil
}

func (l *logind) Close() error { return l.conn.Close() }

// inhibitDelayMax is how long logind waits for delay locks before it
// shuts the machine down anyway.
func (l *logind) inhibitDelayMax() (time.Duration, error) {
	v, err := l.conn.Object(logindService, logindObject).GetProperty(logindInterface + ".InhibitDelayMaxUSec")
	if err != nil {
		return 0, fmt.Errorf("reading logind's InhibitDelayMaxUSec: %w", err)
	}
	usec, ok := v.Value().(uint64)
	if !ok {
		return 0, fmt.Errorf("logind's InhibitDelayMaxUSec is a %s, not a uint64", v.Signature())
	}
	return time.Duration(usec) * time.Microsecond, nil
}

// inhibit takes a delay lock on shutdown: logind waits (up to its
// InhibitDelayMaxSec) for the returned file to be closed.
func (l *logind) inhibit(ctx context.Context) (*os.File, error) {
	var fd dbus.UnixFD
	call := l.conn.Object(logindService, logindObject).CallWithContext(ctx, logindInterface+".Inhibit", 0,
		"shutdown", "orch", "orch agent stops the node's pods before the machine shuts down", "delay")
	if err := call.Store(&fd); err != nil {
		return nil, fmt.Errorf("taking logind's shutdown delay lock: %w", err)
	}
	return os.NewFile(uintptr(fd), "logind-inhibitor"), nil
}

// watchShutdown delivers logind's PrepareForShutdown signals: true as the
// machine begins to shut down or reboot, false if that was cancelled. The
// channel closes when the bus connection does.
func (l *logind) watchShutdown() (<-chan bool, error) {
	if err := l.conn.AddMatchSignal(dbus.WithMatchObjectPath(logindObject), dbus.WithMatchInterface(logindInterface),
		dbus.WithMatchMember("PrepareForShutdown")); err != nil {
		return nil, fmt.Errorf("watching logind's PrepareForShutdown: %w", err)
	}
	signals := make(chan *dbus.Signal, 4)
	l.conn.Signal(signals)
	out := make(chan bool)
	go func() {
		defer close(out)
		for {
			select {
			case <-l.conn.Context().Done():
				return
			case s, ok := <-signals:
				if !ok {
					return
				}
				if s.Name != logindInterface+".PrepareForShutdown" || len(s.Body) != 1 {
					continue
				}
				if on, ok := s.Body[0].(bool); ok {
					select {
					case out <- on:
					case <-l.conn.Context().Done():
						return
					}
				}
			}
		}
	}()
	return out, nil
}

// raiseDelay makes logind wait at least want for delay locks: it writes
// the drop-in into dir and has systemd send logind SIGHUP, which makes it
// read its configuration again, as the kubelet does. It returns the delay
// logind then allows.
func (l *logind) raiseDelay(ctx context.Context, dir string, want time.Duration) (time.Duration, error) {
	if err := writeDropIn(dir, want); err != nil {
		return 0, err
	}
	call := l.conn.Object(systemdService, systemdObject).CallWithContext(ctx, systemdInterface+".KillUnit", 0,
		"systemd-logind.service", "all", int32(syscall.SIGHUP))
	if call.Err != nil {
		return 0, fmt.Errorf("reloading logind's configuration: %w", call.Err)
	}
	// logind reloads after answering; give it a moment.
	var have time.Duration
	for range 20 {
		var err error
		if have, err = l.inhibitDelayMax(); err != nil || have >= want {
			return have, err
		}
		select {
		case <-ctx.Done():
			return have, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return have, nil
}

func writeDropIn(dir string, delay time.Duration) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("logind drop-in: %w", err)
	}
	seconds := int64((delay + time.Second - 1) / time.Second)
	body := "# Written by orch agent: logind waits this long for the node's pods to stop\n" +
		"# (--shutdown-grace-period) before the machine shuts down.\n[Login]\nInhibitDelayMaxSec=" + strconv.FormatInt(seconds, 10) + "\n"
	path := filepath.Join(dir, DropInName)
	if old, err := os.ReadFile(path); err == nil && string(old) == body {
		return nil
	}
	if err := atomicfile.Write(path, []byte(body), 0o644); err != nil {
		return fmt.Errorf("logind drop-in: %w", err)
	}
	return nil
}
