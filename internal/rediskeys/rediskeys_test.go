package rediskeys

import "testing"

func TestGlobEscape(t *testing.T) {
	if got, want := GlobEscape(`a*b?c[d]e\f`), `a\*b\?c\[d\]e\\f`; got != want {
		t.Errorf("GlobEscape = %q, want %q", got, want)
	}
}
