package openapi

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/orch-dev/orch/internal/api/resources/builtin"
)

func TestAcceptsGzip(t *testing.T) {
	for _, tc := range []struct {
		headers []string
		want    bool
	}{
		{nil, false},
		{[]string{"gzip"}, true}, // Go's transport
		{[]string{"deflate, gzip;q=1.0, *;q=0.5"}, true},
		{[]string{"GZIP"}, true},
		{[]string{"identity"}, false},
		{[]string{"br", "x-gzip"}, true},
		{[]string{"gzip;q=0"}, false},
		{[]string{"gzip; q=0.000"}, false},
		{[]string{"gzip;q=0, *"}, false}, // named gzip decides
		{[]string{"*"}, true},
		{[]string{"*;q=0"}, false},
		{[]string{"gzipped"}, false},
	} {
		if got := acceptsGzip(tc.headers); got != tc.want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", tc.headers, got, tc.want)
		}
	}
}

// The documents are kept compressed: a client that accepts gzip is sent
// them so, one that does not gets the same JSON, and a server that has
// served every group's document holds a fraction of its size.
func TestDocumentsKeptCompressed(t *testing.T) {
	h := NewHandler(Static(builtin.Resources()))
	get := func(path, encoding string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		if encoding != "" {
			req.Header.Set("Accept-Encoding", encoding)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	var index struct {
		Paths map[string]struct {
			URL string `json:"serverRelativeURL"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(get("/openapi/v3", "gzip").Body.Bytes(), &index); err != nil || len(index.Paths) < 10 {
		t.Fatalf("index: %v, %d paths", err, len(index.Paths))
	}
	plainTotal, keptTotal := 0, 0
	for path, e := range index.Paths {
		plain := get(e.URL, "")
		if plain.Code != 200 || plain.Header().Get("Content-Encoding") != "" || !json.Valid(plain.Body.Bytes()) {
			t.Fatalf("%s without gzip: %d %q, valid JSON %v", path, plain.Code, plain.Header().Get("Content-Encoding"), json.Valid(plain.Body.Bytes()))
		}
		zipped := get(e.URL, "gzip")
		if zipped.Code != 200 || zipped.Header().Get("Content-Encoding") != "gzip" || zipped.Header().Get("Vary") != "Accept-Encoding" {
			t.Fatalf("%s with gzip: %d, Content-Encoding %q, Vary %q", path, zipped.Code, zipped.Header().Get("Content-Encoding"), zipped.Header().Get("Vary"))
		}
		zr, err := gzip.NewReader(zipped.Body)
		if err != nil {
			t.Fatal(err)
		}
		unzipped, err := io.ReadAll(zr)
		if err != nil || !bytes.Equal(unzipped, plain.Body.Bytes()) {
			t.Fatalf("%s: the gzip body is not the plain one (%v)", path, err)
		}
		plainTotal += plain.Body.Len()
	}
	for _, doc := range h.docs.val.docs {
		keptTotal += len(doc.body.gz)
	}
	t.Logf("%d documents: %d KB of JSON, kept in %d KB", len(index.Paths), plainTotal>>10, keptTotal>>10)
	if keptTotal*5 > plainTotal {
		t.Errorf("the documents are kept in %d bytes, want a fifth of their %d or less", keptTotal, plainTotal)
	}
}

func TestV2KeptCompressed(t *testing.T) {
	h := NewV2Handler(Static(builtin.Resources()))
	for _, accept := range []string{"application/json", "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"} {
		var bodies [][]byte
		for _, encoding := range []string{"", "gzip"} {
			req := httptest.NewRequest(http.MethodGet, "/openapi/v2", nil)
			req.Header.Set("Accept", accept)
			if encoding != "" {
				req.Header.Set("Accept-Encoding", encoding)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			body := rec.Body.Bytes()
			if got := rec.Header().Get("Content-Encoding"); got != encoding {
				t.Fatalf("%s, Accept-Encoding %q: Content-Encoding %q", accept, encoding, got)
			}
			if encoding == "gzip" {
				zr, err := gzip.NewReader(bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				if body, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
			}
			bodies = append(bodies, body)
		}
		if len(bodies[0]) == 0 || !bytes.Equal(bodies[0], bodies[1]) {
			t.Errorf("%s: the gzip body is not the plain one", accept)
		}
	}
}
