package joinproto

import (
	"strings"
	"testing"
)

func TestTokens(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	tests := []struct {
		in      string
		want    Token
		wantErr bool
	}{
		{in: "K10" + hash + "::server:s3cret", want: Token{CAHash: hash, Secret: "s3cret"}},
		{in: "s3cret", want: Token{Secret: "s3cret"}},
		{in: "", wantErr: true},
		{in: "K10" + hash + "s3cret", wantErr: true},
		{in: "K10abc::server:s", wantErr: true},
		{in: "K10" + strings.Repeat("zz", 32) + "::server:s", wantErr: true},
		{in: "K10" + hash + "::server:", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseToken(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseToken(%q) = %+v, %v", tt.in, got, err)
		}
		if err == nil && got.String() != tt.in {
			t.Errorf("%q prints back as %q", tt.in, got.String())
		}
	}
}
