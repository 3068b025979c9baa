package kube

import (
	"fmt"
	"strings"
)

// rewriteCELStrings rewrites the string literals of a CEL expression:
// rename gets each literal's text and answers the new text and whether it
// renamed it. Quotes, prefixes (r, b) and everything outside literals stay;
// a literal with escape sequences is not decoded and is kept. It returns
// the expression and the literals kept; an unterminated literal is an error
// and the expression is then to be kept whole.
func rewriteCELStrings(expr string, rename func(string) (string, bool)) (string, []string, error) {
	var b strings.Builder
	var kept []string
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '/' && strings.HasPrefix(expr[i:], "//"):
			end := strings.IndexByte(expr[i:], '\n')
			if end < 0 {
				end = len(expr) - i
			}
			b.WriteString(expr[i : i+end])
			i += end
		case c == '"' || c == '\'':
			raw := celRawPrefix(expr, i)
			q := string(c)
			if strings.HasPrefix(expr[i:], q+q+q) {
				q = q + q + q
			}
			body, n, err := celLiteralBody(expr[i+len(q):], q, raw)
			if err != nil {
				return expr, nil, fmt.Errorf("string literal at byte %d: %w", i, err)
			}
			text := body
			renamed := false
			if raw || !strings.Contains(body, `\`) {
				text, renamed = rename(body)
			}
			if !renamed {
				text = body
				kept = append(kept, body)
			}
			b.WriteString(q + text + q)
			i += len(q) + n + len(q)
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String(), kept, nil
}

// celRawPrefix says whether the quote at i opens a raw string (r"..",
// R'..', br"..").
func celRawPrefix(expr string, i int) bool {
	j := i
	for j > 0 && i-j < 2 && strings.IndexByte("rRbB", expr[j-1]) >= 0 {
		j--
	}
	if j > 0 && isCELIdent(expr[j-1]) {
		return false // the letters end an identifier: not a prefix
	}
	return strings.ContainsAny(expr[j:i], "rR")
}

func isCELIdent(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// celLiteralBody returns the text of a literal up to its closing quote q
// and its length in bytes.
func celLiteralBody(s, q string, raw bool) (string, int, error) {
	for i := 0; i < len(s); i++ {
		switch {
		case !raw && s[i] == '\\':
			i++ // the escaped byte cannot close the literal
		case len(q) == 1 && (s[i] == '\n' || s[i] == '\r'):
			return "", 0, fmt.Errorf("a new line inside a quoted string")
		case strings.HasPrefix(s[i:], q):
			return s[:i], i, nil
		}
	}
	return "", 0, fmt.Errorf("no closing %s", q)
}
