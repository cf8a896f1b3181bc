// Wraps each dashboards/*.json as a typed constant, `const dashboard: Dashboard = <the JSON>`,
// in generated/<name>.ts, so that `tsc --strict` checks it against Grafana's published
// dashboard types (@grafana/schema): unknown keys (excess properties), wrong value types and
// enum values outside the schema's are errors. The schema spells some closed sets of strings as
// TypeScript enums (ThresholdsMode, FieldColorModeId, ...), which a JSON string cannot be
// assigned to: `Json<T>` replaces each enum by the union of its string values, keeping every
// other type (and the excess property checks) as the schema has them.
import { readdirSync, readFileSync, writeFileSync, mkdirSync, rmSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const dashboards = join(here, "..");
const out = join(here, "generated");
rmSync(out, { recursive: true, force: true });
mkdirSync(out);
const files = readdirSync(dashboards).filter((f) => f.endsWith(".json"));
if (files.length === 0) {
  console.error(`no dashboard JSON in ${dashboards}`);
  process.exit(1);
}
for (const f of files) {
  const json = JSON.parse(readFileSync(join(dashboards, f), "utf8"));
  const ts =
    `import type { Dashboard } from "@grafana/schema";\n\n` +
    `type Json<T> = T extends string\n` +
    `  ? string extends T ? string : \`\${T}\`\n` +
    `  : T extends number | boolean | null | undefined ? T\n` +
    `  : T extends Array<infer U> ? Array<Json<U>>\n` +
    `  : T extends object ? { [K in keyof T]: Json<T[K]> }\n` +
    `  : T;\n\n` +
    `// Generated from dashboards/${f} by wrap.mjs.\n` +
    `export const dashboard: Json<Dashboard> = ${JSON.stringify(json, null, 2)};\n`;
  writeFileSync(join(out, f.replace(/\.json$/, ".ts")), ts);
}
console.log(`wrapped ${files.length} dashboards: ${files.join(", ")}`);
