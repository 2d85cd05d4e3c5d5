package openapi

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// compressed is a document kept gzip-compressed. Once a client has asked
// for them (kubectl apply and explain do), the documents stay for the life
// of the server: 4-5 MB of JSON for the built-in groups and the Gateway
// API's, a tenth of that compressed. Clients that accept gzip (client-go
// and kubectl do, through Go's transport) are sent it as kept; others get
// it decompressed as it is written.
type compressed struct {
	gz   []byte
	size int // uncompressed
}

func compress(body []byte) (compressed, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(body); err != nil {
		return compressed{}, fmt.Errorf("compress openapi document: %w", err)
	}
	if err := zw.Close(); err != nil {
		return compressed{}, fmt.Errorf("compress openapi document: %w", err)
	}
	return compressed{gz: bytes.Clone(buf.Bytes()), size: len(body)}, nil
}

// write sends the document in the encoding r accepts. The headers but
// Content-Encoding are the caller's, set before.
func (c compressed) write(w http.ResponseWriter, r *http.Request) {
	if acceptsGzip(r.Header.Values("Accept-Encoding")) {
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write(c.gz)
		return
	}
	zr, err := gzip.NewReader(bytes.NewReader(c.gz))
	if err != nil { // cannot happen: compress wrote it
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	_, _ = io.Copy(w, zr)
}

// acceptsGzip reads Accept-Encoding (RFC 9110 12.5.3): gzip with a
// weight other than zero, or, when gzip is not named, * with one.
func acceptsGzip(headers []string) bool {
	gzipOK, star := false, false
	named := false
	for _, h := range headers {
		for part := range strings.SplitSeq(h, ",") {
			coding, params, _ := strings.Cut(part, ";")
			coding = strings.ToLower(strings.TrimSpace(coding))
			weighted := true
			for param := range strings.SplitSeq(params, ";") {
				if k, v, ok := strings.Cut(strings.TrimSpace(param), "="); ok && strings.EqualFold(k, "q") {
					q, err := strconv.ParseFloat(v, 64)
					weighted = err == nil && q > 0
				}
			}
			switch coding {
			case "gzip", "x-gzip":
				named = true
				gzipOK = gzipOK || weighted
			case "*":
				star = star || weighted
			}
		}
	}
	if named {
		return gzipOK
	}
	return star
}
