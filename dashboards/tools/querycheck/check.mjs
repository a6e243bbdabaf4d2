// Parses LogQL and TraceQL queries with the Lezer grammars Grafana's query editors use.
//
// stdin: a JSON array of {"id", "lang": "logql" | "traceql", "query"}.
// stdout: a JSON array of {"id", "ok", "error"?}; a query fails when the parse tree holds an
// error node (Lezer recovers from errors, so "no exception" alone would prove nothing).
// Exit status 0 when every query parses, 1 when any fails, 2 on bad input.
import { parser as logql } from "@grafana/lezer-logql";
import { parser as traceql } from "@grafana/lezer-traceql";
import { readFileSync } from "node:fs";

const parsers = { logql, traceql };

function firstError(parserFor, query) {
  let error = null;
  parserFor.parse(query).iterate({
    enter(node) {
      if (error === null && node.type.isError) {
        const near = query.slice(Math.max(0, node.from - 10), node.to + 10);
        error = `syntax error at offset ${node.from}, near ${JSON.stringify(near)}`;
      }
      return error === null;
    },
  });
  return error;
}

let inputs;
try {
  inputs = JSON.parse(readFileSync(0, "utf8"));
} catch (err) {
  console.error(`querycheck: reading input: ${err}`);
  process.exit(2);
}
let failed = false;
const results = inputs.map(({ id, lang, query }) => {
  const parserFor = parsers[lang];
  const error = parserFor ? firstError(parserFor, query) : `unknown language ${lang}`;
  failed ||= error !== null;
  return error === null ? { id, ok: true } : { id, ok: false, error };
});
console.log(JSON.stringify(results, null, 2));
process.exit(failed ? 1 : 0);
