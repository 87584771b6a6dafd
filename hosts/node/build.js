// Transpiles a component for this host (`just node-host`): `node build.js COMPONENT.wasm OUT-DIR`.
// The component's own imports go to src/glue.js and its outgoing HTTP to src/http.js; WASI's
// other imports are the shim's. The glue is written for one version of the contract, so a
// component of another version is refused, and OUT-DIR is left as it was.

import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, renameSync, rmSync } from "node:fs";
import { basename, dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { CONTRACT_VERSION } from "./src/glue.js";

const [component, outArg] = process.argv.slice(2);
if (!component || !outArg) {
  console.error("usage: node build.js COMPONENT.wasm OUT-DIR");
  process.exit(2);
}
const out = resolve(outArg);
const src = fileURLToPath(new URL("./src/", import.meta.url));
// Built beside OUT-DIR, so that the generated imports of ../src/... resolve the same there.
const staging = join(dirname(out), `.${basename(out)}.${process.pid}`);
const from = relative(out, src).split("\\").join("/");
const module = (file) => (from.startsWith(".") ? `${from}/${file}` : `./${from}/${file}`);

try {
  // jco runs on the Node that runs this, whichever is first on PATH.
  execFileSync(
    process.execPath,
    [
      fileURLToPath(new URL("node_modules/@bytecodealliance/jco/dist/jco.js", import.meta.url)),
      "transpile", component, "-o", staging, "--quiet",
      "--map", `meltano:state-backend/*=${module("glue.js")}#*`,
      "--map", `wasi:http/types=${module("http.js")}#types`,
      "--map", `wasi:http/outgoing-handler=${module("http.js")}#outgoingHandler`,
    ],
    { stdio: "inherit" },
  );
  const types = readFileSync(join(staging, `${basename(component, ".wasm")}.d.ts`), "utf8");
  const versions = new Set(
    [...types.matchAll(/meltano:state-backend\/[a-z-]+@([0-9A-Za-z.+-]+)/g)].map((m) => m[1]),
  );
  if (versions.size !== 1 || !versions.has(CONTRACT_VERSION)) {
    console.error(
      `build.js: ${component} is for meltano:state-backend@${[...versions].join(", ") || "?"}; ` +
        `this host's glue (src/glue.js) is for ${CONTRACT_VERSION}. ${outArg} is unchanged.`,
    );
    process.exitCode = 1;
  } else {
    if (existsSync(out)) rmSync(out, { recursive: true });
    renameSync(staging, out);
  }
} finally {
  rmSync(staging, { recursive: true, force: true });
}
