package encryption

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/orch-dev/orch/internal/store"
	"k8s.io/apiserver/pkg/storage/value"
)

// Store is one resource's view of a store whose values are encrypted:
// what it writes is encrypted with the configuration's first provider,
// what it reads is decrypted with the one that wrote it. Its keys and
// revisions are the store's.
type Store struct {
	store.Store
	resource string
	t        atomic.Pointer[value.Transformer]
}

// Wrap encrypts resource's values in s as cfg says.
func Wrap(s store.Store, resource string, cfg *Config) (*Store, error) {
	w := &Store{Store: s, resource: resource}
	return w, w.Reload(cfg)
}

// Reload takes a new configuration (a rotated key): later writes use its
// first provider.
func (s *Store) Reload(cfg *Config) error {
	rc := cfg.For(s.resource)
	if rc == nil {
		return fmt.Errorf("the encryption configuration no longer names %s", s.resource)
	}
	t, err := rc.transformer()
	if err != nil {
		return err
	}
	s.t.Store(&t)
	return nil
}

func (s *Store) from(ctx context.Context, kv *store.KeyValue) error {
	if kv == nil || kv.Value == nil {
		return nil
	}
	plain, _, err := (*s.t.Load()).TransformFromStorage(ctx, kv.Value, value.DefaultContext(kv.Key))
	if err != nil {
		return fmt.Errorf("decrypting %s: %w", kv.Key, err)
	}
	kv.Value = plain
	return nil
}

func (s *Store) to(ctx context.Context, key string, plain []byte) ([]byte, error) {
	out, err := (*s.t.Load()).TransformToStorage(ctx, plain, value.DefaultContext(key))
	if err != nil {
		return nil, fmt.Errorf("encrypting %s: %w", key, err)
	}
	return out, nil
}

// Get reads and decrypts key.
func (s *Store) Get(ctx context.Context, key string) (store.KeyValue, error) {
	kv, err := s.Store.Get(ctx, key)
	if err != nil {
		return kv, err
	}
	return kv, s.from(ctx, &kv)
}

// List reads and decrypts a page.
func (s *Store) List(ctx context.Context, prefix string, opts store.ListOptions) (store.ListResult, error) {
	res, err := s.Store.List(ctx, prefix, opts)
	if err != nil {
		return res, err
	}
	for i := range res.KVs {
		if err := s.from(ctx, &res.KVs[i]); err != nil {
			return store.ListResult{}, err
		}
	}
	return res, nil
}

// Create encrypts and writes a new key.
func (s *Store) Create(ctx context.Context, key string, plain []byte) (store.KeyValue, error) {
	data, err := s.to(ctx, key, plain)
	if err != nil {
		return store.KeyValue{}, err
	}
	kv, err := s.Store.Create(ctx, key, data)
	if err == nil {
		kv.Value = plain
	}
	return kv, err
}

// Update encrypts and writes key.
func (s *Store) Update(ctx context.Context, key string, plain []byte, expectedModRevision int64) (store.KeyValue, error) {
	data, err := s.to(ctx, key, plain)
	if err != nil {
		return store.KeyValue{}, err
	}
	kv, err := s.Store.Update(ctx, key, data, expectedModRevision)
	if err == nil {
		kv.Value = plain
	}
	return kv, err
}

// Delete deletes key and returns what it held, decrypted.
func (s *Store) Delete(ctx context.Context, key string, expectedModRevision int64) (store.KeyValue, int64, error) {
	prev, rev, err := s.Store.Delete(ctx, key, expectedModRevision)
	if err != nil {
		return prev, rev, err
	}
	return prev, rev, s.from(ctx, &prev)
}

// Watch delivers the store's events with their values decrypted; a value
// that cannot be decrypted ends the watch with the error (the watcher
// relists and meets it there).
func (s *Store) Watch(ctx context.Context, prefix string, afterRevision int64) (store.Watcher, error) {
	inner, err := s.Store.Watch(ctx, prefix, afterRevision)
	if err != nil {
		return nil, err
	}
	w := &watcher{Watcher: inner, events: make(chan store.Event), stopped: make(chan struct{})}
	go w.run(ctx, s)
	return w, nil
}

type watcher struct {
	store.Watcher
	events   chan store.Event
	stopped  chan struct{}
	stopOnce sync.Once
	err      error
}

func (w *watcher) Stop() {
	w.stopOnce.Do(func() { close(w.stopped) })
	w.Watcher.Stop()
}

func (w *watcher) Events() <-chan store.Event { return w.events }

func (w *watcher) Err() error {
	if w.err != nil {
		return w.err
	}
	return w.Watcher.Err()
}

func (w *watcher) run(ctx context.Context, s *Store) {
	defer close(w.events)
	for ev := range w.Watcher.Events() {
		err := s.from(ctx, &ev.KV)
		if err == nil && ev.PrevKV != nil {
			prev := *ev.PrevKV
			err = s.from(ctx, &prev)
			ev.PrevKV = &prev
		}
		if err != nil {
			w.err = err
			w.Watcher.Stop()
			for range w.Watcher.Events() {
			}
			return
		}
		select {
		case w.events <- ev:
		case <-w.stopped:
			return
		case <-ctx.Done():
			return
		}
	}
}

// Usage counts the resource's stored values under prefix by what wrote
// them (KeyName: "aescbc:NAME", "identity", ...).
func (s *Store) Usage(ctx context.Context, prefix string) (map[string]int, error) {
	out := map[string]int{}
	err := s.scan(ctx, prefix, func(kv store.KeyValue) error {
		out[KeyName(kv.Value)]++
		return nil
	})
	return out, err
}

// Reencrypt writes again, with the first provider, every value under
// prefix that another wrote, and returns how many it rewrote. A value
// changed meanwhile was written with the first provider anyway.
func (s *Store) Reencrypt(ctx context.Context, prefix string, writeKey string) (int, error) {
	n := 0
	err := s.scan(ctx, prefix, func(kv store.KeyValue) error {
		if KeyName(kv.Value) == writeKey {
			return nil
		}
		plain := kv
		if err := s.from(ctx, &plain); err != nil {
			return err
		}
		data, err := s.to(ctx, kv.Key, plain.Value)
		if err != nil {
			return err
		}
		if _, err := s.Store.Update(ctx, kv.Key, data, kv.ModRevision); err != nil && !errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("rewriting %s: %w", kv.Key, err)
		}
		n++
		return nil
	})
	return n, err
}

// scan visits the raw stored values under prefix, a page at a time.
func (s *Store) scan(ctx context.Context, prefix string, visit func(store.KeyValue) error) error {
	opts := store.ListOptions{Limit: 500}
	for {
		res, err := s.Store.List(ctx, prefix, opts)
		if err != nil {
			return err
		}
		for _, kv := range res.KVs {
			if err := visit(kv); err != nil {
				return err
			}
		}
		if res.Continue == "" {
			return nil
		}
		opts.Continue = res.Continue
	}
}
