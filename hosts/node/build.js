// Transpiles a component for this host (`just node-host`): `node build.js COMPONENT.wasm OUT-DIR`.
// The component's own imports go to src/glue.js and its outgoing HTTP to src/http.js; WASI's
// other imports are the shim's. The glue is written for one version of the contract, so a
// component of another version is refused here rather than linked to the wrong glue.

import { execFileSync } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import { basename, join } from "node:path";
import { fileURLToPath } from "node:url";
import { CONTRACT_VERSION } from "./src/glue.js";

const [component, out] = process.argv.slice(2);
if (!component || !out) {
  console.error("usage: node build.js COMPONENT.wasm OUT-DIR");
  process.exit(2);
}
// jco runs on the Node that runs this, whichever is first on PATH.
execFileSync(
  process.execPath,
  [
    fileURLToPath(new URL("node_modules/@bytecodealliance/jco/dist/jco.js", import.meta.url)),
    "transpile", component, "-o", out, "--quiet",
    "--map", "meltano:state-backend/*=../src/glue.js#*",
    "--map", "wasi:http/types=../src/http.js#types",
    "--map", "wasi:http/outgoing-handler=../src/http.js#outgoingHandler",
  ],
  { stdio: "inherit" },
);
const types = readFileSync(join(out, `${basename(component, ".wasm")}.d.ts`), "utf8");
const versions = new Set([...types.matchAll(/meltano:state-backend\/[a-z-]+@([0-9A-Za-z.+-]+)/g)].map((m) => m[1]));
if (versions.size !== 1 || !versions.has(CONTRACT_VERSION)) {
  rmSync(out, { recursive: true, force: true });
  console.error(
    `build.js: ${component} is for meltano:state-backend@${[...versions].join(", ") || "?"}; ` +
      `this host's glue (src/glue.js) is for ${CONTRACT_VERSION}`,
  );
  process.exit(1);
}
