package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/api/pki"
	"github.com/orch-dev/orch/internal/joinproto"
)

// The control socket: what orch's own commands ask of the running server
// on its machine (orch snapshot save, orch token rotate, orch
// secrets-encrypt, orch upgrade), over a unix
// socket only root may open, as k3s's commands reach its server's
// datastore.

// ControlSocket is where a running server takes its commands.
func ControlSocket(dataDir string) string { return filepath.Join(dataDir, "server", "control.sock") }

// serveControlSocket answers orch's commands until ctx ends.
func (s *Server) serveControlSocket(ctx context.Context) error {
	path := ControlSocket(s.cfg.DataDir)
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return err
	}
	reply := func(w http.ResponseWriter, v any, err error) {
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /snapshots", func(w http.ResponseWriter, r *http.Request) {
		name, dir := r.URL.Query().Get("name"), r.URL.Query().Get("dir")
		if name == "" {
			name = "on-demand"
		}
		if dir == "" {
			dir = s.snapshotDir()
		}
		snap, err := saveSnapshot(r.Context(), dir, name, s.takeSnapshot)
		if err == nil {
			s.log.Info("snapshot saved", "path", snap.Path, "revision", snap.Revision, "bytes", snap.Size)
		}
		reply(w, snap, err)
	})
	// What every server sharing a datastore must hold alike is changed on
	// one only; until the others follow, it is refused there.
	shared := func(what string) error {
		if !s.sharedStore() {
			return nil
		}
		return fmt.Errorf("%s is not yet possible with servers sharing a datastore: each would hold another one", what)
	}
	mux.HandleFunc("POST /token/rotate", func(w http.ResponseWriter, r *http.Request) {
		if err := shared("rotating the token"); err != nil {
			reply(w, nil, err)
			return
		}
		token, err := s.rotateToken(r.URL.Query().Get("secret"))
		reply(w, map[string]string{"token": token}, err)
	})
	mux.HandleFunc("POST /certificates/rotate", func(w http.ResponseWriter, r *http.Request) {
		out, err := s.rotateCertificates()
		reply(w, out, err)
	})
	mux.HandleFunc("POST /certificates/rotate-ca", func(w http.ResponseWriter, r *http.Request) {
		if err := shared("rotating the CA"); err != nil {
			reply(w, nil, err)
			return
		}
		q := r.URL.Query()
		out, err := s.rotateCA(r.Context(), q.Get("drop-previous") == "true", q.Get("force") == "true")
		reply(w, out, err)
	})
	for action, do := range map[string]func(context.Context) (EncryptionStatus, error){
		"status": s.encryptionStatus, "rotate": s.rotateEncryptionKey, "reencrypt": s.reencrypt,
	} {
		mux.HandleFunc("POST /secrets-encrypt/"+action, func(w http.ResponseWriter, r *http.Request) {
			if action != "status" {
				if err := shared("changing the secrets encryption key"); err != nil {
					reply(w, nil, err)
					return
				}
			}
			status, err := do(r.Context())
			reply(w, status, err)
		})
	}
	s.controlUpgrades(mux, reply)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
		_ = os.Remove(path)
	}()
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// control asks the server running on dataDir, decoding its answer into
// out. reached is false when no server answers on the socket.
func control(ctx context.Context, dataDir, path string, query url.Values, out any) (reached bool, err error) {
	return controlWithBody(ctx, dataDir, path, query, nil, out)
}

// controlWithBody is control sending body as JSON (none when nil).
func controlWithBody(ctx context.Context, dataDir, path string, query url.Values, body, out any) (reached bool, err error) {
	socket := ControlSocket(dataDir)
	var payload io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return false, err
		}
		payload = bytes.NewReader(data)
	}
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://orch"+path+"?"+query.Encode(), payload)
	resp, err := client.Do(req)
	if err != nil {
		return false, nil
	}
	defer func() { _ = resp.Body.Close() }()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return true, fmt.Errorf("the server: %s", strings.TrimSpace(string(answer)))
	}
	return true, json.Unmarshal(answer, out)
}

// rotateToken replaces the join secret (a random one when secret is ""):
// written to DATA/server/token first, then in force. Nodes that joined
// keep their certificates; joins with the old token are refused.
func (s *Server) rotateToken(secret string) (string, error) {
	token, err := writeToken(filepath.Join(s.cfg.DataDir, "server"), s.ca(), secret)
	if err != nil {
		return "", err
	}
	tok, _ := joinproto.ParseToken(token)
	s.tokenMu.Lock()
	s.token = token
	s.tokenMu.Unlock()
	if s.joins != nil {
		s.joins.SetSecret(tok.Secret)
	}
	s.log.Info("join token rotated")
	return token, nil
}

func writeToken(serverDir string, ca *pki.CA, secret string) (string, error) {
	if secret == "" {
		var buf [16]byte
		if _, err := rand.Read(buf[:]); err != nil {
			return "", err
		}
		secret = hex.EncodeToString(buf[:])
	}
	given := secret
	if tok, err := joinproto.ParseToken(secret); err == nil {
		given = tok.Secret
	}
	if len(given) < minTokenSecret {
		return "", fmt.Errorf("a join secret of %d characters is too easy to guess: give at least %d", len(given), minTokenSecret)
	}
	return ca.LoadOrCreateToken(filepath.Join(serverDir, "token"), secret)
}

// RotateToken is `orch token rotate`: through the running server, or in
// its data dir when none runs (it takes the new token when it starts). It
// returns the new token.
func RotateToken(ctx context.Context, dataDir, secret string) (string, error) {
	var got map[string]string
	reached, err := control(ctx, dataDir, "/token/rotate", url.Values{"secret": {secret}}, &got)
	if reached {
		return got["token"], err
	}
	tlsDir := filepath.Join(dataDir, "server", "tls")
	if _, err := os.Stat(filepath.Join(tlsDir, "ca.crt")); err != nil {
		return "", errors.New("no server has run on this data dir: nothing to rotate")
	}
	ca, err := pki.LoadOrCreateCA(tlsDir)
	if err != nil {
		return "", err
	}
	return writeToken(filepath.Join(dataDir, "server"), ca, secret)
}
