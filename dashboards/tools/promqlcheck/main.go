// Command promqlcheck parses PromQL expressions with Prometheus's own parser.
//
// It reads a JSON array of {"id": ..., "expr": ...} objects on stdin and writes a JSON
// array of {"id": ..., "ok": bool, "error": "...", "type": "..."} on stdout, one per input,
// so that dashboard and rule tests can check every expression without a running server.
// Exit status 0 when every expression parses, 1 when any fails, 2 on bad input.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/prometheus/prometheus/promql/parser"
)

type input struct {
	ID   string `json:"id"`
	Expr string `json:"expr"`
}

type result struct {
	ID    string `json:"id"`
	OK    bool   `json:"ok"`
	Type  string `json:"type,omitempty"`
	Error string `json:"error,omitempty"`
}

func main() {
	var inputs []input
	if err := json.NewDecoder(os.Stdin).Decode(&inputs); err != nil {
		fmt.Fprintln(os.Stderr, "promqlcheck: reading input:", err)
		os.Exit(2)
	}
	// Default options: only stable PromQL, the language a stock Prometheus accepts.
	promql := parser.NewParser(parser.Options{})
	results := make([]result, 0, len(inputs))
	failed := false
	for _, in := range inputs {
		expr, err := promql.ParseExpr(in.Expr)
		if err != nil {
			failed = true
			results = append(results, result{ID: in.ID, Error: err.Error()})
			continue
		}
		results = append(results, result{ID: in.ID, OK: true, Type: string(expr.Type())})
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(results); err != nil {
		fmt.Fprintln(os.Stderr, "promqlcheck: writing output:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}
