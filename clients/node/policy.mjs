// The policy in your engine: an rlgate export (`rlgate export --checkpoint DIR --output FILE.onnx`) acting
// in-process with onnxruntime-node, no server at all (docs/onnx.md).
//
//   import { loadPolicy } from "./policy.mjs";
//   const policy = await loadPolicy("cartpole.onnx");
//   let episode = policy.newEpisode();
//   const action = await policy.act(obs, episode, reward);   // greedy; call newEpisode() at every reset
//
// A file exported with --explore (or sent by a server's WatchWeights with `onnx`: policyFromBytes) also samples:
// `await policy.sample(obs, episode, reward, random)` gives {action, moduleAction, logp, distInputs}, the action
// drawn from noise made with `random()` (uniform in [0, 1)), as the server samples (docs/onnx.md, "Sampling"):
// `action` for the env, `moduleAction` the module's own (what an episode records: for Box actions the file's
// `module_actions`, before they are unsquashed or clipped; for the others the same as `action`).
// `policy.recordedDtype` is the dtype of `moduleAction` ("int64", "float32").
//
// The file's contract (its inputs, outputs and initial state: docs/onnx.md) is the JSON string under
// `rlgate.contract` in the model's metadata_props. onnxruntime-node does not expose a model's metadata, so
// readContract reads that field from the file's bytes: field 14 of the ModelProto, entries of key (1) and
// value (2) strings.

import { readFile } from "node:fs/promises";

import ort from "onnxruntime-node";

const CONTRACT_KEY = "rlgate.contract";

// One protobuf field at `pos`: [field number, wire type, value (Uint8Array for length-delimited), next pos].
function readField(bytes, pos) {
  const varint = () => {
    let value = 0n;
    for (let shift = 0n; ; shift += 7n) {
      const byte = bytes[pos++];
      value |= BigInt(byte & 0x7f) << shift;
      if (byte < 0x80) return value;
    }
  };
  const key = Number(varint());
  const wire = key & 7;
  if (wire === 0) return [key >> 3, wire, varint(), pos];
  if (wire === 1) return [key >> 3, wire, null, pos + 8];
  if (wire === 5) return [key >> 3, wire, null, pos + 4];
  if (wire !== 2) throw new Error(`unsupported protobuf wire type ${wire}`);
  const length = Number(varint());
  return [key >> 3, wire, bytes.subarray(pos, pos + length), pos + length];
}

export function readContract(bytes) {
  const text = new TextDecoder();
  for (let pos = 0; pos < bytes.length; ) {
    const [field, wire, value, next] = readField(bytes, pos);
    pos = next;
    if (field !== 14 || wire !== 2) continue; // metadata_props: StringStringEntryProto
    const entry = {};
    for (let at = 0; at < value.length; ) {
      const [sub, , data, after] = readField(value, at);
      at = after;
      entry[sub === 1 ? "key" : "value"] = text.decode(data);
    }
    if (entry.key === CONTRACT_KEY) return JSON.parse(entry.value);
  }
  throw new Error(`no ${CONTRACT_KEY} in the model's metadata: not an rlgate export`);
}

const ARRAYS = { float32: Float32Array, float64: Float64Array, int64: BigInt64Array, int32: Int32Array };

function tensor(spec, values, rows = 1) {
  const Type = ARRAYS[spec.dtype];
  if (!Type) throw new Error(`${spec.name}: dtype ${spec.dtype} is not handled here`);
  const flat = values.flat(Infinity);
  const data = Type === BigInt64Array ? BigInt64Array.from(flat, BigInt) : Type.from(flat);
  return new ort.Tensor(spec.dtype, data, [rows, ...spec.shape.slice(1)]);
}

// One row's action: a number (Discrete: [batch]) or an array of numbers (MultiDiscrete, Box: [batch, k]).
function actionOf(output) {
  const values = Array.from(output.data, Number);
  return output.dims.length === 1 ? values[0] : values;
}

export async function loadPolicy(file) {
  return policyFromBytes(await readFile(file));
}

// Noise of the file's kind: Exponential(1) draws (-log(1 - U)) or N(0, 1) ones (Box-Muller).
const NOISE = {
  exponential: (random) => -Math.log(1 - random()),
  normal: (random) => Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random()),
};

export async function policyFromBytes(bytes) {
  const contract = readContract(bytes);
  const session = await ort.InferenceSession.create(bytes, { intraOpNumThreads: 1, interOpNumThreads: 1 });
  const inputs = Object.fromEntries(contract.inputs.map((spec) => [spec.name, spec]));
  const obsSpec = contract.inputs[0];
  if (obsSpec.name !== "obs") throw new Error("this in-process policy takes one observation input ('obs')");

  // One step of one env: the file's outputs, the episode's state carried on.
  async function run(obs, episode, reward, noise) {
    const feeds = { obs: tensor(obsSpec, obs) };
    if (inputs.reward) feeds.reward = tensor(inputs.reward, [episode.started ? reward : 0]);
    for (const [name, value] of Object.entries(episode.state)) {
      feeds[`state_in.${name}`] = tensor(inputs[`state_in.${name}`], value);
    }
    if (inputs.noise) feeds.noise = tensor(inputs.noise, noise(inputs.noise.shape[1]));
    const out = await session.run(feeds);
    for (const name of Object.keys(episode.state)) episode.state[name] = Array.from(out[`state_out.${name}`].data);
    episode.started = true;
    return { out, action: actionOf(out.actions) };
  }

  // The output an episode records: the module's own actions (docs/onnx.md, the tensor contract).
  const recorded = contract.outputs.find((spec) => spec.name === "module_actions")?.name ?? "actions";
  return {
    contract,
    recordedDtype: contract.outputs.find((spec) => spec.name === recorded).dtype,
    // An episode holds what the file carries from step to step: its state_in values, the initial state first.
    newEpisode() {
      return { state: { ...contract.initial_state }, started: false };
    },
    // The greedy action (noise of all greedy_noise: the same action as a file exported without --explore).
    async act(obs, episode, reward = 0) {
      return (await run(obs, episode, reward, (width) => new Array(width).fill(contract.greedy_noise))).action;
    },
    // A sampled action, its log-probability and the distribution inputs it was drawn from (an --explore file).
    async sample(obs, episode, reward, random) {
      const draw = NOISE[contract.noise_kind];
      if (draw === undefined) throw new Error("this file does not sample: export it with --explore");
      const noise = (width) => Array.from({ length: width }, () => draw(random));
      const { out, action } = await run(obs, episode, reward, noise);
      const [moduleAction, logp] = [actionOf(out[recorded]), out.action_logp.data[0]];
      return { action, moduleAction, logp, distInputs: Array.from(out.action_dist_inputs.data) };
    },
  };
}
