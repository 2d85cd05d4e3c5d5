package ingress

import (
	"net/http"
	"strconv"
	"strings"

	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// A route's CORS filter, as the Gateway API describes it: a preflight
// request (OPTIONS with Origin and Access-Control-Request-Method) is
// answered by the proxy, with the allowed methods and headers when the
// origin is allowed and without any CORS header when it is not; other
// requests from an allowed origin get Access-Control-Allow-Origin (and
// -Credentials, -Expose-Headers) on the backend's response.

// corsOrigin reports whether the filter allows origin: "*", an exact
// scheme://host[:port], or scheme://*.domain for its subdomains.
func corsOrigin(f *gatewayv1.HTTPCORSFilter, origin string) bool {
	if origin == "" {
		return false
	}
	for _, o := range f.AllowOrigins {
		allowed := string(o)
		switch {
		case allowed == "*" || allowed == origin:
			return true
		case strings.Contains(allowed, "://*."):
			scheme, rest, _ := strings.Cut(allowed, "://*")
			if strings.HasPrefix(origin, scheme+"://") {
				host := strings.TrimPrefix(origin, scheme+"://")
				if strings.HasSuffix(host, rest) && len(host) > len(rest) {
					return true
				}
			}
		}
	}
	return false
}

// corsPreflight answers a preflight request; false when r is none.
func corsPreflight(w http.ResponseWriter, r *http.Request, f *gatewayv1.HTTPCORSFilter) bool {
	method := r.Header.Get("Access-Control-Request-Method")
	origin := r.Header.Get("Origin")
	if r.Method != http.MethodOptions || origin == "" || method == "" {
		return false
	}
	if !corsOrigin(f, origin) {
		w.WriteHeader(http.StatusNoContent)
		return true
	}
	h := w.Header()
	corsAllowOrigin(h, f, origin)
	var methods []string
	for _, m := range f.AllowMethods {
		if m == "*" {
			methods = []string{method}
			break
		}
		methods = append(methods, string(m))
	}
	h.Set("Access-Control-Allow-Methods", strings.Join(methods, ", "))
	var headers []string
	for _, name := range f.AllowHeaders {
		if name == "*" {
			headers = []string{r.Header.Get("Access-Control-Request-Headers")}
			break
		}
		headers = append(headers, string(name))
	}
	if len(headers) > 0 && headers[0] != "" {
		h.Set("Access-Control-Allow-Headers", strings.Join(headers, ", "))
	}
	corsExpose(h, f)
	maxAge := f.MaxAge
	if maxAge == 0 {
		maxAge = 5 // the spec's default
	}
	h.Set("Access-Control-Max-Age", strconv.Itoa(int(maxAge)))
	w.WriteHeader(http.StatusNoContent)
	return true
}

func corsAllowOrigin(h http.Header, f *gatewayv1.HTTPCORSFilter, origin string) {
	h.Set("Access-Control-Allow-Origin", origin)
	h.Add("Vary", "Origin")
	if f.AllowCredentials != nil && *f.AllowCredentials {
		h.Set("Access-Control-Allow-Credentials", "true")
	}
}

func corsExpose(h http.Header, f *gatewayv1.HTTPCORSFilter) {
	var names []string
	for _, n := range f.ExposeHeaders {
		names = append(names, string(n))
	}
	if len(names) > 0 {
		h.Set("Access-Control-Expose-Headers", strings.Join(names, ", "))
	}
}

// corsResponse is the headers a CORS filter puts on the response to a
// request from an allowed origin (nil for none).
func corsResponse(f *gatewayv1.HTTPCORSFilter, origin string) *gatewayv1.HTTPHeaderFilter {
	if !corsOrigin(f, origin) {
		return nil
	}
	h := http.Header{}
	corsAllowOrigin(h, f, origin)
	corsExpose(h, f)
	out := &gatewayv1.HTTPHeaderFilter{}
	for name, values := range h {
		out.Set = append(out.Set, gatewayv1.HTTPHeader{Name: gatewayv1.HTTPHeaderName(name), Value: strings.Join(values, ", ")})
	}
	return out
}
