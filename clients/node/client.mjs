// A CartPole env client for rlgate, written from proto/README.md and the .proto files alone.
//
//   npm ci && node client.mjs --server 127.0.0.1:50051 --episodes 3
//   node client.mjs --server 127.0.0.1:50051 --mode wrong-spaces
//
// "run" mode (the default) checks the health service, opens one PolicyService/Connect stream with one
// sub-env, plays --episodes CartPole-v1 episodes on its own JavaScript CartPole, sends Close and prints a
// JSON summary on stdout. "wrong-spaces" mode sends a hello whose observation space is float64 (a common
// JavaScript slip: numbers are doubles) and prints the final status the server ends the stream with.
//
//   node client.mjs --mode in-process --model cartpole.onnx --episodes 100 [--explore]
//
// "in-process" mode needs no server: it plays its CartPole (or with --env pendulum its Pendulum) with a file
// `rlgate export` wrote, loaded with onnxruntime-node (policy.mjs), greedily or (--explore, a file exported with
// --explore) sampling, and prints each episode's return.
//
//   node client.mjs --server 127.0.0.1:50051 --mode local --steps 5000 [--env pendulum] [--spool-dir DIR]
//
// "local" mode acts in-process and trains on the server's learner: it gets each version of the policy as an ONNX
// file over WatchWeights, samples its env's actions with it (--env: its JavaScript CartPole-v1, or Pendulum-v1 for
// Box actions), and sends the episodes to SubmitEpisodes (episodes.mjs records them as a server does), paced by the
// learner; its summary counts what it shipped. With --spool-dir the batches not acknowledged yet are kept on disk
// too (spool.mjs): a client killed and started again with the same directory sends them first; sampling waits while
// the spool holds --max-spool-bytes (1 GiB) or more, as the Python client's --max-spool. With --bench it runs
// until `rlgate bench` (its B8 placement `local-node`) says stop on stdin, reporting its steps per window.
//
//   node client.mjs --server 127.0.0.1:50051 --mode multi-agent --game cartpole --envs 2 --episodes 6
//   node client.mjs --server 127.0.0.1:50051 --mode multi-agent --game tictactoe --envs 3 --episodes 6
//   node client.mjs --server 127.0.0.1:50051 --mode multi-agent-script --case no-all
//
// "multi-agent" mode opens a multi-agent session (README, "Multi-agent sessions") on a server whose run spec
// has a [multi_agent] section and plays until --episodes episodes ended in its --envs sub-envs: "cartpole"
// is examples/multi_agent_cartpole.py's game (two poles, agents leave as their poles fall or time out,
// --max-episode-steps), "tictactoe" PettingZoo's tictactoe_v3 (examples/tictactoe.toml), turn by turn. Its
// summary holds each agent's actions, rewards and flags per episode. "multi-agent-script" sends one of a few
// fixed step sequences on multi-agent CartPole, most of them malformed, and prints the final status.
// Exit status: 0 when the run went as the README says, 1 otherwise (the reason on stderr).

import { randomUUID } from "node:crypto";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

import { chunkTable, EpisodeRecorder } from "./episodes.mjs";
import { loadPolicy, policyFromBytes } from "./policy.mjs";
import { Spool } from "./spool.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));

const { values: args } = parseArgs({
  options: {
    server: { type: "string", default: "127.0.0.1:50051" },
    mode: { type: "string", default: "run" }, // run | wrong-spaces | multi-agent | multi-agent-script | in-process
    // | local
    model: { type: "string" }, // in-process: the file `rlgate export` wrote
    explore: { type: "boolean", default: false }, // in-process: sample (a file exported with --explore)
    episodes: { type: "string", default: "3" },
    steps: { type: "string", default: "2000" }, // local: env steps to take
    "client-id": { type: "string" }, // local: the name the server lists it by
    env: { type: "string", default: "cartpole" }, // local, in-process: cartpole | pendulum
    "spool-dir": { type: "string" }, // local: keep unacknowledged batches here too (else in memory only)
    "max-spool-bytes": { type: "string", default: String(2 ** 30) }, // local: sampling waits while the spool holds more
    bench: { type: "boolean", default: false }, // local: driven by `rlgate bench` over stdin (BenchWindow)
    "drain-timeout-s": { type: "string", default: "10" }, // local: the wait for the last acks
    game: { type: "string", default: "cartpole" }, // multi-agent modes: cartpole | tictactoe
    envs: { type: "string", default: "2" }, // multi-agent modes: sub-envs in the stream
    "max-episode-steps": { type: "string", default: "500" }, // multi-agent cartpole: each pole's time limit
    case: { type: "string" }, // multi-agent-script: which messages to send
    seed: { type: "string", default: "0" },
    token: { type: "string" }, // the server's --token, sent as `authorization: Bearer <token>`
    "proto-dir": { type: "string", default: path.join(HERE, "..", "..", "proto") },
    "timeout-s": { type: "string", default: "60" }, // the whole run, however it goes
  },
});
const EPISODES = Number(args.episodes);
const TIMEOUT_MS = Number(args["timeout-s"]) * 1000;

// Nothing may hang: past the time limit the client gives up, whatever it is waiting for.
const watchdog = setTimeout(() => fail(`no result within ${args["timeout-s"]} s`), TIMEOUT_MS);
watchdog.unref();

function fail(reason) {
  console.error(`client.mjs: ${reason}`);
  process.exit(1);
}

// ---------------------------------------------------------------------------------------------------
// The contract: the .proto files loaded at run time, `proto/` as the include path (proto/README.md).
// keepCase keeps the proto's field names (observation_space, not observationSpace); enums arrive as
// their names ("DTYPE_INT32"); int64 fields as strings, so that nothing is rounded; oneofs: true adds
// a `kind` field naming the member that is set.
// ---------------------------------------------------------------------------------------------------

const definition = protoLoader.loadSync(["rlgate/v1/policy.proto", "grpc/health/v1/health.proto"], {
  includeDirs: [args["proto-dir"]],
  keepCase: true,
  enums: String,
  longs: String,
  defaults: true,
  oneofs: true,
});
const loaded = grpc.loadPackageDefinition(definition);
const PolicyService = loaded.rlgate.v1.PolicyService;
const Health = loaded.grpc.health.v1.Health;

// Keepalive as the README's "Deadlines" asks: ping after 10 s without traffic, give up 5 s later.
const CHANNEL_OPTIONS = { "grpc.keepalive_time_ms": 10000, "grpc.keepalive_timeout_ms": 5000 };

function authMetadata() {
  const metadata = new grpc.Metadata();
  if (args.token !== undefined) metadata.set("authorization", `Bearer ${args.token}`);
  return metadata;
}

// ---------------------------------------------------------------------------------------------------
// Tensors: dtype + shape + data, the values little-endian in C order (README, "Tensors"). DataView
// writes the byte order explicitly, so this holds on any machine.
// ---------------------------------------------------------------------------------------------------

function float32Tensor(values, shape) {
  const view = new DataView(new ArrayBuffer(values.length * 4));
  values.forEach((v, i) => view.setFloat32(i * 4, v, true)); // +-Infinity stays an IEEE infinity
  return { dtype: "DTYPE_FLOAT32", shape, data: Buffer.from(view.buffer) };
}

function float64Tensor(values, shape) {
  const view = new DataView(new ArrayBuffer(values.length * 8));
  values.forEach((v, i) => view.setFloat64(i * 8, v, true));
  return { dtype: "DTYPE_FLOAT64", shape, data: Buffer.from(view.buffer) };
}

function boolTensor(values, shape) {
  return { dtype: "DTYPE_BOOL", shape, data: Buffer.from(values.map((v) => (v ? 1 : 0))) };
}

// The integer actions of an answer, whatever integer dtype they come in (the README says to read it).
const INT_READERS = {
  DTYPE_INT8: [1, (view, at) => view.getInt8(at)],
  DTYPE_INT16: [2, (view, at) => view.getInt16(at, true)],
  DTYPE_INT32: [4, (view, at) => view.getInt32(at, true)],
  DTYPE_INT64: [8, (view, at) => Number(view.getBigInt64(at, true))],
  DTYPE_UINT8: [1, (view, at) => view.getUint8(at)],
  DTYPE_UINT16: [2, (view, at) => view.getUint16(at, true)],
  DTYPE_UINT32: [4, (view, at) => view.getUint32(at, true)],
  DTYPE_UINT64: [8, (view, at) => Number(view.getBigUint64(at, true))],
};

function readIntegers(tensor) {
  const reader = INT_READERS[tensor.dtype];
  if (reader === undefined) throw new Error(`actions of dtype ${tensor.dtype}, not an integer dtype`);
  const [size, read] = reader;
  const data = tensor.data;
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const count = tensor.shape.reduce((n, d) => n * Number(d), 1);
  if (data.byteLength !== count * size) throw new Error(`actions: ${data.byteLength} bytes for shape ${tensor.shape}`);
  return Array.from({ length: count }, (_, i) => read(view, i * size));
}

// ---------------------------------------------------------------------------------------------------
// CartPole-v1's spaces, as gymnasium declares them: Box(float32, [4]) whose velocity bounds are
// infinite, and Discrete(2). The bounds are the float32 values gymnasium holds: x threshold * 2 and
// 12 degrees * 2 in radians.
// ---------------------------------------------------------------------------------------------------

const THETA_THRESHOLD = (12 * 2 * Math.PI) / 360;
const X_THRESHOLD = 2.4;
const HIGH = [X_THRESHOLD * 2, Infinity, THETA_THRESHOLD * 2, Infinity];

function cartpoleSpaces(boxTensor) {
  return {
    observation_space: { box: { low: boxTensor(HIGH.map((h) => -h), [4]), high: boxTensor(HIGH, [4]) } },
    action_space: { discrete: { n: 2, start: 0 } },
  };
}

// ---------------------------------------------------------------------------------------------------
// CartPole-v1 as gymnasium computes it (cartpole.py: euler integration, reward 1 per step, the
// episode terminated past 2.4 m or 12 degrees, truncated at 500 steps by TimeLimit). The state is
// kept in doubles; observations are its float32 rounding, as gymnasium returns them.
// ---------------------------------------------------------------------------------------------------

// mulberry32: a small seeded generator, so that --seed repeats a run exactly.
function random(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// An env's seeded generator and its state, set by reset().
class SeededEnv {
  constructor(seed) {
    this.random = random(seed);
    this.state = null;
    this.steps = 0;
  }
}

class CartPole extends SeededEnv {
  static GRAVITY = 9.8;
  static MASSCART = 1.0;
  static MASSPOLE = 0.1;
  static TOTAL_MASS = CartPole.MASSPOLE + CartPole.MASSCART;
  static LENGTH = 0.5; // half the pole's length
  static POLEMASS_LENGTH = CartPole.MASSPOLE * CartPole.LENGTH;
  static FORCE_MAG = 10.0;
  static TAU = 0.02;
  static MAX_STEPS = 500;

  observation() {
    return this.state.map(Math.fround);
  }

  reset() {
    this.state = [0, 0, 0, 0].map(() => this.random() * 0.1 - 0.05); // uniform in [-0.05, 0.05)
    this.steps = 0;
    return this.observation();
  }

  step(action) {
    let [x, xDot, theta, thetaDot] = this.state;
    const force = action === 1 ? CartPole.FORCE_MAG : -CartPole.FORCE_MAG;
    const cos = Math.cos(theta);
    const sin = Math.sin(theta);
    const temp = (force + CartPole.POLEMASS_LENGTH * thetaDot ** 2 * sin) / CartPole.TOTAL_MASS;
    const thetaAcc =
      (CartPole.GRAVITY * sin - cos * temp) /
      (CartPole.LENGTH * (4.0 / 3.0 - (CartPole.MASSPOLE * cos ** 2) / CartPole.TOTAL_MASS));
    const xAcc = temp - (CartPole.POLEMASS_LENGTH * thetaAcc * cos) / CartPole.TOTAL_MASS;
    x += CartPole.TAU * xDot;
    xDot += CartPole.TAU * xAcc;
    theta += CartPole.TAU * thetaDot;
    thetaDot += CartPole.TAU * thetaAcc;
    this.state = [x, xDot, theta, thetaDot];
    this.steps += 1;
    const terminated = x < -X_THRESHOLD || x > X_THRESHOLD || theta < -THETA_THRESHOLD || theta > THETA_THRESHOLD;
    const truncated = this.steps >= CartPole.MAX_STEPS;
    return { obs: this.observation(), reward: 1.0, terminated, truncated };
  }
}

// ---------------------------------------------------------------------------------------------------
// Pendulum-v1 as gymnasium computes it (pendulum.py: the angle and angular velocity in doubles, the torque clipped
// to [-2, 2], the velocity to [-8, 8]; reward -(angle^2 + 0.1 velocity^2 + 0.001 torque^2) with the angle
// normalised to [-pi, pi); never terminated, truncated at 200 steps by TimeLimit). Observations are
// [cos, sin, velocity] rounded to float32; Box(float32, [3]) and actions Box(-2, 2, [1], float32).
// ---------------------------------------------------------------------------------------------------

class Pendulum extends SeededEnv {
  static MAX_SPEED = 8;
  static MAX_TORQUE = 2;
  static DT = 0.05;
  static G = 10.0;
  static M = 1.0;
  static L = 1.0;
  static MAX_STEPS = 200;

  observation() {
    const [theta, thetaDot] = this.state;
    return [Math.cos(theta), Math.sin(theta), thetaDot].map(Math.fround);
  }

  reset() {
    this.state = [(this.random() * 2 - 1) * Math.PI, this.random() * 2 - 1]; // uniform in [-pi, pi) x [-1, 1)
    this.steps = 0;
    return this.observation();
  }

  step(action) {
    const clip = (v, bound) => Math.min(Math.max(v, -bound), bound);
    const [theta, thetaDot] = this.state;
    const u = clip(action[0], Pendulum.MAX_TORQUE);
    const angle = ((((theta + Math.PI) % (2 * Math.PI)) + 2 * Math.PI) % (2 * Math.PI)) - Math.PI; // Python's %
    const cost = angle ** 2 + 0.1 * thetaDot ** 2 + 0.001 * u ** 2;
    const { G, L, M, DT, MAX_SPEED } = Pendulum;
    const velocity = clip(thetaDot + ((3 * G) / (2 * L) * Math.sin(theta) + (3.0 / (M * L ** 2)) * u) * DT, MAX_SPEED);
    this.state = [theta + velocity * DT, velocity];
    this.steps += 1;
    return { obs: this.observation(), reward: -cost, terminated: false, truncated: this.steps >= Pendulum.MAX_STEPS };
  }
}

// The envs --env names, with the kind of action space each takes (the served one must be of it).
const ENVS = { cartpole: { Env: CartPole, actions: "discrete" }, pendulum: { Env: Pendulum, actions: "box" } };

function envOf(name) {
  if (!(name in ENVS)) fail(`--env is one of ${Object.keys(ENVS).join(", ")}`);
  return ENVS[name];
}

// ---------------------------------------------------------------------------------------------------
// The stream: writes, and reads one answer at a time; an error is the stream's final status.
// ---------------------------------------------------------------------------------------------------

function openStream(client) {
  const call = client.Connect(authMetadata()); // no deadline on Connect (README, "Deadlines")
  // Every call ends with a status: OK after Close, else the error (code and details).
  const status = new Promise((resolve) => call.on("status", resolve));
  call.on("error", () => {}); // the error is read from `status` (and from the failed read)
  const answers = call[Symbol.asyncIterator]();
  return {
    call,
    status,
    write: (message) => call.write(message),
    // The next ServerMessage; a stream that ends instead is an error, with its final status.
    async read() {
      const next = await answers.next().catch((error) => ({ error }));
      if (next.error !== undefined || next.done) {
        const { code, details } = await status;
        throw Object.assign(new Error(`stream ended: ${grpc.status[code]} ${details}`), { code, details });
      }
      return next.value;
    },
  };
}

// Send Close and require the stream's status to be OK (it ends at once: the server reads nothing after it);
// the status's name.
async function closeWithOk(stream, client) {
  stream.write({ close: {} });
  const { code, details } = await stream.status;
  client.close();
  if (code !== grpc.status.OK) fail(`the stream ended with ${grpc.status[code]}: ${details}`);
  return grpc.status[code];
}

// A google.protobuf.Struct of numbers. proto-loader ships its own struct.proto, whose fields stay camelCased
// even with keepCase: true: `number_value` would be dropped without a word, `numberValue` is kept.
function struct(numbers) {
  return { fields: Object.fromEntries(Object.entries(numbers).map(([k, v]) => [k, { numberValue: v }])) };
}

function stepMessage(obs, steps, reward, terminated, truncated) {
  const step = { obs: { tensor: float32Tensor(obs, [1, 4]) } }; // [N, 4] with N = 1 sub-env
  step.infos = [struct({ steps })]; // optional, one per sub-env: stored with the episode's observations
  if (reward !== undefined) {
    // Rewards as JavaScript has them, float64 (any float dtype is taken); the flags are bool [N].
    step.reward = float64Tensor([reward], [1]);
    step.terminated = boolTensor([terminated], [1]);
    step.truncated = boolTensor([truncated], [1]);
  }
  return { step };
}

function checkHealth(channelTarget) {
  const health = new Health(channelTarget, grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
  const deadline = () => new Date(Date.now() + 5000);
  const ask = (service) =>
    new Promise((resolve, reject) =>
      // The health service needs no token (README, "Connecting").
      health.Check({ service }, { deadline: deadline() }, (error, answer) =>
        error ? reject(error) : resolve(answer.status),
      ),
    );
  return Promise.all(["", "rlgate.v1.PolicyService"].map(ask)).then(([all, policy]) => {
    health.close();
    return { "": all, "rlgate.v1.PolicyService": policy };
  });
}

async function run() {
  const health = await checkHealth(args.server);
  if (Object.values(health).some((s) => s !== "SERVING")) fail(`health: ${JSON.stringify(health)}`);

  // A stream (on a channel of its own, so that a new one may reach another replica), its hello and welcome.
  const sessions = [];
  const versions = new Set();
  async function connect() {
    const client = new PolicyService(args.server, grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
    const stream = openStream(client);
    stream.write({
      hello: { client_id: "node-cartpole", ...cartpoleSpaces(float32Tensor), num_envs: 1, explore: true },
    });
    const welcome = await stream.read();
    if (welcome.kind !== "welcome") fail(`the first answer is ${welcome.kind}, not welcome`);
    sessions.push(welcome.welcome.session_id);
    versions.add(welcome.welcome.model_version);
    return { client, stream };
  }

  let { client, stream } = await connect();
  const env = new CartPole(Number(args.seed));
  const episodes = []; // {length, return, terminated, truncated, reset_obs}
  let episode;
  // A new episode: its reset observation. The first step after a hello carries no reward or flags (README, "The
  // first step"); after an ended episode, reward 0 and flags false (checked, then ignored).
  function reset(first = false) {
    const obs = env.reset();
    episode = { length: 0, return: 0, reset_obs: obs };
    stream.write(first ? stepMessage(obs, 0) : stepMessage(obs, 0, 0.0, false, false));
  }
  reset(true);
  let status = null; // the last stream's, once it ended
  let envSteps = 0;
  let handovers = 0;
  let ended = false; // the last step sent ended the episode: its answer's action is to be discarded

  // Each episode ends within 500 steps, and each answer moves one on (or hands the stream over, at most once per
  // episode), so EPISODES * 502 answers bound the loop.
  for (let answers = 0; answers < EPISODES * (CartPole.MAX_STEPS + 2); answers++) {
    const answer = await stream.read();
    if (answer.kind !== "actions") fail(`an answer of kind ${answer.kind}`);
    versions.add(answer.actions.model_version);
    if (answer.actions.reconnect) {
      // The server hands the session over (README, "Moving to another replica"): every episode it recorded has
      // ended, so these actions are not for the env. Close, then a new stream through the same target, and a new
      // episode on it (the episode begun on this stream, if any, was never recorded).
      handovers += 1;
      status = await closeWithOk(stream, client);
      if (episodes.length >= EPISODES) break;
      ({ client, stream } = await connect());
      status = null;
      reset(true);
      ended = false;
      continue;
    }
    if (ended) {
      // The answer to the step that carried the episode's final observation: discarded (autoreset NEXT_STEP).
      // Read before the next reset goes, so that a reconnect in it is seen before anything else is sent.
      if (episodes.length >= EPISODES) break;
      reset();
      ended = false;
      continue;
    }
    const [action] = readIntegers(answer.actions.actions.tensor); // Discrete: int32 [N]
    const { obs, reward, terminated, truncated } = env.step(action);
    envSteps += 1;
    episode.length += 1;
    episode.return += reward;
    stream.write(stepMessage(obs, env.steps, reward, terminated, truncated));
    if (terminated || truncated) {
      episodes.push({ ...episode, terminated, truncated });
      ended = true;
    }
  }
  if (episodes.length < EPISODES) fail(`only ${episodes.length} of ${EPISODES} episodes ended`);

  // Close: no episode is running (the last one ended), and the stream ends with OK at once.
  status ??= await closeWithOk(stream, client);

  return {
    session_id: sessions[0],
    session_ids: sessions,
    handovers,
    health,
    episodes: episodes.length,
    lengths: episodes.map((e) => e.length),
    returns: episodes.map((e) => e.return),
    terminated: episodes.map((e) => e.terminated),
    truncated: episodes.map((e) => e.truncated),
    reset_observations: episodes.map((e) => e.reset_obs),
    env_steps: envSteps,
    // int64 versions arrive as decimal strings (longs: String); they are small enough for a number.
    model_versions: [...versions].map(Number).sort((a, b) => a - b),
    status,
  };
}

async function wrongSpaces() {
  const client = new PolicyService(args.server, grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
  const stream = openStream(client);
  // float64 bounds where the model's Box is float32: the server does not convert spaces.
  stream.write({
    hello: { client_id: "node-wrong-spaces", ...cartpoleSpaces(float64Tensor), num_envs: 1, explore: true },
  });
  const answer = await stream.read().catch((error) => error);
  client.close();
  if (!(answer instanceof Error)) fail(`the hello was answered with ${answer.kind}, not an error`);
  return { code: answer.code, code_name: grpc.status[answer.code], details: answer.details };
}

// ===================================================================================================
// Multi-agent sessions (README, "Multi-agent sessions"): the hello declares every agent with its spaces
// (`agents`, no observation_space/action_space); each step carries one AgentsStep per sub-env, keyed by
// agent id; each answer one AgentActions per sub-env, with exactly the agents that observed and are not
// done. Values are unbatched: one agent's observation or action, without the leading axis N.
// ===================================================================================================

function int8Tensor(values, shape) {
  const view = new DataView(new ArrayBuffer(values.length));
  values.forEach((v, i) => view.setInt8(i, v));
  return { dtype: "DTYPE_INT8", shape, data: Buffer.from(view.buffer) };
}

// One agent's action from an answer: an integer tensor of shape [] (a Discrete action, unbatched).
function readAction(value, agent) {
  if (value.kind !== "tensor") throw new Error(`the action of ${agent} is a ${value.kind}, not a tensor`);
  const shape = value.tensor.shape.map(Number);
  if (shape.length !== 0) throw new Error(`the action of ${agent} has shape [${shape}], not [] (unbatched)`);
  return readIntegers(value.tensor)[0];
}

// Multi-agent CartPole, the repository's examples/multi_agent_cartpole.py as its ParallelEnv behaves: one
// CartPole-v1 per agent ("agent_0", "agent_1", ...), all acting every step; an agent whose pole falls
// (terminated) or reaches the time limit (truncated) leaves, and the episode ends when every agent has left.
class MultiAgentCartPole {
  constructor(seed, { numAgents = 2, maxSteps = CartPole.MAX_STEPS } = {}) {
    this.possibleAgents = Array.from({ length: numAgents }, (_, i) => `agent_${i}`);
    this.poles = Object.fromEntries(this.possibleAgents.map((a, i) => [a, new CartPole(seed + i)]));
    this.maxSteps = maxSteps;
    this.agents = [];
  }

  static spaces() {
    return cartpoleSpaces(float32Tensor);
  }

  value(obs) {
    return { tensor: float32Tensor(obs, [4]) }; // unbatched: [4], not [1, 4]
  }

  reset() {
    this.agents = [...this.possibleAgents];
    const obs = {};
    const infos = {};
    for (const agent of this.agents) {
      obs[agent] = this.value(this.poles[agent].reset());
      infos[agent] = { steps: 0 };
    }
    return { obs, infos };
  }

  // actions: agent -> action for every agent still in the env. Like a ParallelEnv's step: every such agent's
  // observation, reward and flags (a leaving agent's observation is its final one).
  step(actions) {
    const out = { obs: {}, rewards: {}, terminateds: {}, truncateds: {}, infos: {} };
    for (const agent of this.agents) {
      const pole = this.poles[agent];
      const { obs, reward, terminated } = pole.step(actions[agent]);
      out.obs[agent] = this.value(obs);
      out.rewards[agent] = reward;
      out.terminateds[agent] = terminated;
      out.truncateds[agent] = pole.steps >= this.maxSteps; // gymnasium's TimeLimit (both may be true)
      out.infos[agent] = { steps: pole.steps };
    }
    this.agents = this.agents.filter((a) => !(out.terminateds[a] || out.truncateds[a]));
    return out;
  }
}

// Tic-tac-toe as PettingZoo's classic tictactoe_v3 plays it (an AEC env: the players take turns), sent as the
// README says turn-based envs are: one acting agent per step. "player_1" (X) opens. Each player observes a
// Dict {action_mask: int8 [9], observation: int8 [3, 3, 2]} (plane 0 its own marks, plane 1 the opponent's;
// the mask holds the empty squares for the player whose turn it is, zeros for the other) and plays
// Discrete(9), the square's index. A win pays +1 to the winner and -1 to the loser, a draw 0 to both, a move
// otherwise 0.
const LINES = [
  [0, 1, 2],
  [3, 4, 5],
  [6, 7, 8],
  [0, 3, 6],
  [1, 4, 7],
  [2, 5, 8],
  [0, 4, 8],
  [2, 4, 6],
];

class TicTacToe {
  constructor() {
    this.possibleAgents = ["player_1", "player_2"];
    this.agents = [];
  }

  static spaces() {
    const box = (shape) => {
      const size = shape.reduce((n, d) => n * d, 1);
      const filled = (v) => int8Tensor(new Array(size).fill(v), shape);
      return { box: { low: filled(0), high: filled(1) } }; // int8 bounds of the full shape
    };
    // A Dict's entries in gymnasium's order: its keys sorted.
    const dict = { entries: [{ key: "action_mask", space: box([9]) }, { key: "observation", space: box([3, 3, 2]) }] };
    return { observation_space: { dict }, action_space: { discrete: { n: 9, start: 0 } } };
  }

  observe(agent) {
    const me = this.possibleAgents.indexOf(agent) + 1;
    const planes = [];
    for (let square = 0; square < 9; square++) {
      // [3, 3, 2] in C order: square (row, column) = (square / 3, square % 3) as PettingZoo reshapes its board.
      planes.push(this.board[square] === me ? 1 : 0, this.board[square] === 3 - me ? 1 : 0);
    }
    const toMove = this.possibleAgents[this.turn % 2]; // also once the game is over, as PettingZoo's does
    const mask = this.board.map((mark) => (agent === toMove && mark === 0 ? 1 : 0));
    return {
      dict: {
        items: {
          action_mask: { tensor: int8Tensor(mask, [9]) },
          observation: { tensor: int8Tensor(planes, [3, 3, 2]) },
        },
      },
    };
  }

  reset() {
    this.board = new Array(9).fill(0);
    this.turn = 0;
    this.agents = [...this.possibleAgents];
    return { obs: { player_1: this.observe("player_1") }, infos: { player_1: { turn: 0 } } };
  }

  winner() {
    for (const [a, b, c] of LINES) {
      const mark = this.board[a];
      if (mark !== 0 && this.board[b] === mark && this.board[c] === mark) return mark;
    }
    return 0;
  }

  // actions: {player to move: square}. The mover's reward (0 unless the move ends the game) goes with the next
  // player's observation, so that no player observes again with no reward since its move (README).
  step(actions) {
    const mover = this.possibleAgents[this.turn % 2];
    const square = actions[mover];
    if (Object.keys(actions).length !== 1 || square === undefined) {
      throw new Error(`actions for ${Object.keys(actions)}, not for ${mover} alone`);
    }
    if (!(square >= 0 && square < 9 && this.board[square] === 0)) throw new Error(`${mover} played ${square}: illegal`);
    this.board[square] = this.turn % 2 === 0 ? 1 : 2;
    this.turn += 1;
    const won = this.winner();
    const next = this.possibleAgents[this.turn % 2];
    if (won === 0 && this.turn < 9) {
      return {
        obs: { [next]: this.observe(next) },
        rewards: { [mover]: 0 },
        terminateds: {},
        truncateds: {},
        infos: { [next]: { turn: this.turn } },
      };
    }
    // Game over: both players' final observations, rewards and terminated flags.
    const out = { obs: {}, rewards: {}, terminateds: {}, truncateds: {}, infos: {} };
    for (const [i, agent] of this.possibleAgents.entries()) {
      out.obs[agent] = this.observe(agent);
      out.rewards[agent] = won === 0 ? 0 : won === i + 1 ? 1 : -1;
      out.terminateds[agent] = true;
      out.truncateds[agent] = false;
      out.infos[agent] = { turn: this.turn };
    }
    this.agents = [];
    return out;
  }
}

const GAMES = {
  cartpole: {
    type: MultiAgentCartPole,
    make: (seed) => new MultiAgentCartPole(seed, { maxSteps: Number(args["max-episode-steps"]) }),
    maxLength: () => Number(args["max-episode-steps"]),
  },
  tictactoe: { type: TicTacToe, make: () => new TicTacToe(), maxLength: () => 9 },
};

function agentSpaces(game, agents) {
  return agents.map((agent_id) => ({ agent_id, ...game.type.spaces() }));
}

// One sub-env's AgentsStep. "__all__" is in both flag maps of every AgentsStep, reset ones too (required).
// When the episode is over it says how, as RLlib's ParallelPettingZooEnv does: terminated when every agent
// that ends in this step ended terminated, truncated when every one ended truncated. Where they ended
// differently (a pole falls as the other one's time runs out) both are false: every agent is done, which
// ends the episode too, and each agent keeps its own flags.
function agentsStep({ obs, rewards = {}, terminateds = {}, truncateds = {}, infos = {} }, over) {
  const ending = Object.keys(obs).filter((agent) => terminateds[agent] || truncateds[agent]);
  return {
    obs,
    rewards,
    terminateds: { ...terminateds, __all__: over && ending.every((agent) => terminateds[agent]) },
    truncateds: { ...truncateds, __all__: over && ending.every((agent) => truncateds[agent]) },
    infos: Object.fromEntries(Object.entries(infos).map(([agent, numbers]) => [agent, struct(numbers)])),
  };
}

async function multiAgent() {
  const game = GAMES[args.game];
  if (game === undefined) fail(`--game is one of ${Object.keys(GAMES).join(", ")}`);
  const numEnvs = Number(args.envs);
  const health = await checkHealth(args.server);
  if (Object.values(health).some((s) => s !== "SERVING")) fail(`health: ${JSON.stringify(health)}`);

  const seed = Number(args.seed);
  const slots = Array.from({ length: numEnvs }, (_, i) => ({ index: i, env: game.make(seed + 1000 * i) }));
  const client = new PolicyService(args.server, grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
  const stream = openStream(client);
  stream.write({
    hello: {
      client_id: `node-${args.game}`,
      agents: agentSpaces(game, slots[0].env.possibleAgents),
      num_envs: numEnvs,
      explore: true,
    },
  });
  const welcome = await stream.read();
  if (welcome.kind !== "welcome") fail(`the first answer is ${welcome.kind}, not welcome`);
  const versions = new Set([welcome.welcome.model_version]);

  const finished = []; // the episodes that ended, in the order they ended
  let envSteps = 0;

  // A new episode in a slot. Its agents' records start when they first observe.
  function reset(slot) {
    const { obs, infos } = slot.env.reset();
    slot.episode = { sub_env: slot.index, env_steps: 0, agents: {}, over: false };
    observed(slot, { obs });
    return agentsStep({ obs, infos }, false); // a reset step: rewards and flags ignored, "__all__" still there
  }

  // Per agent: its actions, and one reward per completed step (an action and the agent's next observation):
  // the rewards it got between the two, summed, as the server records them (README).
  function observed(slot, { obs, rewards = {}, terminateds = {}, truncateds = {} }) {
    const records = slot.episode.agents;
    for (const [agent, reward] of Object.entries(rewards)) records[agent].pending += reward;
    slot.expecting = new Set(); // the agents that must get an action in the answer, and only they
    for (const agent of Object.keys(obs)) {
      records[agent] ??= { actions: [], rewards: [], observations: 0, pending: 0, terminated: false, truncated: false };
      const record = records[agent];
      record.observations += 1;
      if (record.actions.length > record.rewards.length) {
        record.rewards.push(record.pending);
        record.pending = 0;
      }
      record.terminated = Boolean(terminateds[agent]);
      record.truncated = Boolean(truncateds[agent]);
      if (!(record.terminated || record.truncated)) slot.expecting.add(agent);
    }
  }

  function advance(slot, actions) {
    const out = slot.env.step(actions);
    envSteps += 1;
    const episode = slot.episode;
    episode.env_steps += 1;
    for (const [agent, action] of Object.entries(actions)) episode.agents[agent].actions.push(action);
    observed(slot, out);
    episode.over = slot.env.agents.length === 0;
    if (episode.over) finished.push(episode);
    return agentsStep(out, episode.over);
  }

  // What the summary says of an episode: per agent its actions, rewards, return, observations and flags.
  function report({ sub_env, env_steps, agents }) {
    const plain = Object.entries(agents).map(([agent, { pending, ...record }]) => [
      agent,
      { ...record, return: record.rewards.reduce((a, b) => a + b, 0) },
    ]);
    return { sub_env, env_steps, agents: Object.fromEntries(plain) };
  }

  stream.write({ step: { agents: slots.map(reset) } }); // the first step: every sub-env's reset observations
  const limit = EPISODES * (game.maxLength() + 1) + 1; // every answer moves the episodes on
  let answers = 0;
  for (; answers < limit; answers++) {
    const answer = await stream.read();
    if (answer.kind !== "actions") fail(`an answer of kind ${answer.kind}`);
    versions.add(answer.actions.model_version);
    const perEnv = answer.actions.agents;
    if (perEnv.length !== numEnvs) fail(`an answer for ${perEnv.length} sub-envs, not ${numEnvs}`);
    const actions = slots.map((slot, i) => {
      const got = Object.entries(perEnv[i].actions).map(([agent, value]) => [agent, readAction(value, agent)]);
      const agents = got.map(([agent]) => agent).sort();
      const expected = [...slot.expecting].sort();
      if (agents.join() !== expected.join()) fail(`sub-env ${i}: actions for [${agents}], expected [${expected}]`);
      return Object.fromEntries(got);
    });
    if (finished.length >= EPISODES) break;
    // An ended episode's slot starts the next one; the others play the actions.
    const agents = slots.map((slot, i) => (slot.episode.over ? reset(slot) : advance(slot, actions[i])));
    stream.write({ step: { agents } });
  }
  if (finished.length < EPISODES) fail(`only ${finished.length} of ${EPISODES} episodes ended in ${answers} answers`);

  // Close: the episodes still running (in the other sub-envs) are shipped as truncated.
  const status = await closeWithOk(stream, client);

  return {
    session_id: welcome.welcome.session_id,
    health,
    episodes: finished.map(report),
    // The episodes Close ended, as the server ships them: truncated, each agent at its last observation.
    running: slots.filter((slot) => !slot.episode.over).map((slot) => report(slot.episode)),
    env_steps: envSteps,
    model_versions: [...versions].map(Number).sort((a, b) => a - b),
    status,
  };
}

// Scripted multi-agent messages (--mode multi-agent-script --case NAME), on multi-agent CartPole with two
// sub-envs: each case sends a hello and fixed steps, reading each answer; the summary has the agents each
// answer acted for (per sub-env) and the stream's final status: the error a malformed message gets (README,
// "Multi-agent sessions" and "Errors"), or OK after Close when every step was answered.
function scriptedStep(obs, { rewards = {}, terminateds = { __all__: false }, truncateds = { __all__: false } } = {}) {
  const values = Object.fromEntries(
    Object.entries(obs).map(([agent, o]) => [agent, { tensor: float32Tensor(o, [4]) }]),
  );
  return { obs: values, rewards, terminateds, truncateds };
}

const OBS = [0.01, -0.02, 0.03, -0.04];
const BOTH = { agent_0: OBS, agent_1: OBS };
const PAID = { rewards: { agent_0: 1, agent_1: 1 } };
const SCRIPTS = {
  // In sub-env 0 one pole falls (terminated) as the other one's time runs out (truncated): every agent is
  // done with its own flag and "__all__" is false in both maps, which ends the episode too (no actions for
  // sub-env 0 in the answer); its next step starts a new episode. Valid throughout: ends with OK.
  "leave-differently": () => [
    [scriptedStep(BOTH), scriptedStep(BOTH)],
    [
      scriptedStep(BOTH, {
        ...PAID,
        terminateds: { agent_0: true, agent_1: false, __all__: false },
        truncateds: { agent_0: false, agent_1: true, __all__: false },
      }),
      scriptedStep(BOTH, PAID),
    ],
    [scriptedStep(BOTH), scriptedStep(BOTH, PAID)],
  ],
  // The first step's sub-env 0 has no "__all__" in terminateds: required in every AgentsStep, reset ones too.
  "no-all": () => [[{ ...scriptedStep(BOTH), terminateds: {} }, scriptedStep(BOTH)]],
  // Sub-env 1 observes an agent the hello did not declare.
  "unknown-agent": () => [[scriptedStep(BOTH), scriptedStep({ agent_0: OBS, agent_7: OBS })]],
  // Both agents acted and observe again, but sub-env 0 sends no reward for agent_1 (RLlib's rule).
  "no-reward": () => [
    [scriptedStep(BOTH), scriptedStep(BOTH)],
    [scriptedStep(BOTH, { rewards: { agent_0: 1 } }), scriptedStep(BOTH, PAID)],
  ],
  // agent_1 leaves (terminated) in sub-env 0's second step and observes again in the third.
  "done-agent": () => [
    [scriptedStep(BOTH), scriptedStep(BOTH)],
    [scriptedStep(BOTH, { ...PAID, terminateds: { agent_1: true, __all__: false } }), scriptedStep(BOTH, PAID)],
    [scriptedStep(BOTH, PAID), scriptedStep(BOTH, PAID)],
  ],
  // agent_1 is truncated without a last observation: the server needs one to bootstrap its value.
  "truncated-without-observation": () => [
    [scriptedStep(BOTH), scriptedStep(BOTH)],
    [
      scriptedStep({ agent_0: OBS }, { ...PAID, truncateds: { agent_1: true, __all__: false } }),
      scriptedStep(BOTH, PAID),
    ],
  ],
  // A step with one AgentsStep where the hello said two sub-envs.
  "too-few-sub-envs": () => [[scriptedStep(BOTH)]],
};

async function multiAgentScript() {
  const hellos = {
    // The single-agent CartPole hello on a multi-agent server.
    "single-agent-hello": { ...cartpoleSpaces(float32Tensor) },
    // A hello declaring an agent the served model does not know.
    "unknown-agent-hello": { agents: agentSpaces(GAMES.cartpole, ["agent_0", "agent_7"]) },
  };
  const script = SCRIPTS[args.case];
  if (script === undefined && !(args.case in hellos)) {
    fail(`--case is one of ${[...Object.keys(SCRIPTS), ...Object.keys(hellos)].join(", ")}`);
  }
  const spaces = hellos[args.case] ?? { agents: agentSpaces(GAMES.cartpole, ["agent_0", "agent_1"]) };
  const client = new PolicyService(args.server, grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
  const stream = openStream(client);
  stream.write({ hello: { client_id: `node-script-${args.case}`, ...spaces, num_envs: 2, explore: true } });
  const answers = [];
  try {
    const welcome = await stream.read();
    if (welcome.kind !== "welcome") fail(`the first answer is ${welcome.kind}, not welcome`);
    for (const agents of script ? script() : []) {
      stream.write({ step: { agents } });
      const answer = await stream.read();
      if (answer.kind !== "actions") fail(`an answer of kind ${answer.kind}`);
      answers.push(answer.actions.agents.map((perEnv) => Object.keys(perEnv.actions).sort()));
    }
    stream.write({ close: {} });
    const { code, details } = await stream.status;
    return { code, code_name: grpc.status[code], details, answers, session_id: welcome.welcome.session_id };
  } catch (error) {
    if (error.code === undefined) throw error;
    return { code: error.code, code_name: grpc.status[error.code], details: error.details, answers };
  } finally {
    client.close();
  }
}

// ---------------------------------------------------------------------------------------------------
// In-process (--mode in-process --model FILE.onnx): the policy in your engine. The exported file acts on
// this process's own CartPole with onnxruntime-node (policy.mjs): no server, no network. Greedy actions, or
// with --explore (a file exported with --explore) actions sampled as the server samples them, from draws seeded
// by --seed; prints each episode's return.
// ---------------------------------------------------------------------------------------------------

async function inProcess() {
  if (!args.model) fail("--mode in-process needs --model FILE.onnx (rlgate export)");
  const policy = await loadPolicy(args.model);
  if (args.explore && !policy.contract.explore) fail(`--explore needs a file exported with --explore: ${args.model}`);
  const { Env } = envOf(args.env);
  const env = new Env(Number(args.seed));
  const draw = random(Number(args.seed) + 1);
  const act = args.explore
    ? async (obs, episode, reward) => (await policy.sample(obs, episode, reward, draw)).action
    : (obs, episode, reward) => policy.act(obs, episode, reward);
  const returns = [];
  for (let i = 0; i < EPISODES; i++) {
    let obs = env.reset();
    const episode = policy.newEpisode();
    let reward = 0;
    let total = 0;
    for (let t = 0; t < Env.MAX_STEPS; t++) {
      const action = await act(obs, episode, reward);
      const result = env.step(action);
      ({ obs, reward } = result);
      total += reward;
      if (result.terminated || result.truncated) break;
    }
    returns.push(total);
  }
  const mean = returns.reduce((a, b) => a + b, 0) / returns.length;
  return { episodes: returns.length, returns, mean_return: mean, model_version: policy.contract.model_version };
}


// ---------------------------------------------------------------------------------------------------
// Local inference (--mode local): act here, train on the learner (proto/README.md, "Local inference"). The policy
// comes over PolicyService/WatchWeights with `onnx: true`: each version as an `rlgate export --explore` file, run
// with onnxruntime-node (policy.mjs); every newer version is loaded while the CartPole goes on stepping and acts
// from the step after it is ready. The episodes are recorded as a server records a session (episodes.mjs) and sent
// to PolicyService/SubmitEpisodes: a hello naming the run spec acted with, then batches. A batch stays in this
// process's spool (spool.mjs: in memory, and with --spool-dir on disk, written before it is sent, so that a process
// started again sends what one killed had not got acknowledged) until its ack, and every unacknowledged one is sent
// again on a new stream (the learner drops chunks it already has). Pacing as the
// Python client keeps it: sampling waits, the running episode shipped as it stands, while the steps not yet
// acknowledged and those not shipped exceed the `room` the last ack granted or, before any ack, while the
// unacknowledged ones reach the weights' `max_unacked_steps` (0: no limit). When the server ends WatchWeights with
// OK (its max session age, or a drain: proto/README.md, "Moving to another replica"), the client moves as the
// Python client does: it half-closes SubmitEpisodes, takes the acks of what it sent, and opens both streams on a
// new channel, which may reach another replica behind the same address (a Service's new connection).
// ---------------------------------------------------------------------------------------------------

// Statuses a new stream may not get again (gRPC's names): reopen the stream, with backoff.
const RETRYABLE = new Set(["UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED"]);

// A promise that resolves at the next fire(): wait() then fire() from a callback, with nothing lost between a look
// and the wait, since JavaScript runs neither in between.
class Signal {
  constructor() {
    this.arm();
  }
  arm() {
    this.promise = new Promise((resolve) => (this.resolve = resolve));
  }
  fire() {
    this.resolve();
    this.arm();
  }
}

// EpisodeBatch messages as bytes, for the spool on disk: the SubmitEpisodes messages' own serialisation.
const SUBMIT = PolicyService.service.SubmitEpisodes;
const BATCH_CODEC = {
  encode: (batch) => SUBMIT.requestSerialize({ batch }),
  decode: (bytes) => SUBMIT.requestDeserialize(bytes).batch,
};

class ServerLink {
  constructor(target, clientId, spoolDir, maxSpoolBytes) {
    this.target = target;
    this.client = new PolicyService(target, grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
    this.clientId = clientId;
    this.changed = new Signal(); // weights ready, an ack, a failure
    this.failure = null;
    this.specJson = null; // the run spec acted with, as its first weights carried it
    this.actionKind = null; // its action space's kind ("discrete", "box", ...)
    this.policy = null; // {policy, version} acted with
    this.pending = null; // a newer one, loaded, until the step loop takes it
    this.newest = null; // the newest received, until it is loading
    this.loading = false;
    this.version = -1; // the newest version received (loaded or loading)
    this.window = 0; // the weights' max_unacked_steps: this client's share (0: no limit)
    this.room = null; // env steps the last ack granted (unset: none said)
    this.spool = new Spool(spoolDir, BATCH_CODEC); // seq -> {batch, steps, bytes}, in seq order, until acknowledged
    this.maxSpoolBytes = maxSpoolBytes; // as the Python client's --max-spool: memory and disk stay bounded
    this.seq = this.spool.lastSeq; // (a spool on disk from before: its batches are sent first)
    // moves: made to a new channel, the server having ended WatchWeights with OK; spool_full: pauses begun with it full
    this.counts = {
      batches: 0,
      chunks: 0,
      steps: 0,
      acked_batches: 0,
      accepted: 0,
      streams: 0,
      pauses: 0,
      moves: 0,
      spool_full: 0,
    };
    this.submit = null; // the SubmitEpisodes call while open (and not half-closed for a move)
    this.moving = null; // the half-closed SubmitEpisodes call of a move, until its status
    this.closing = false;
  }

  fail(reason) {
    this.failure ??= new Error(reason);
    this.changed.fire();
  }

  // Open a stream again after a retryable status (backoff doubling to 2 s), or fail with the status.
  reopen(name, open, attempt) {
    return ({ code, details }) => {
      if (this.closing) return;
      if (code !== grpc.status.OK && !RETRYABLE.has(grpc.status[code])) {
        this.fail(`${name}: ${grpc.status[code]} ${details}`);
        return;
      }
      setTimeout(() => open(attempt + 1), Math.min(50 * 2 ** attempt, 2000));
    };
  }

  watch(attempt = 0) {
    const request = { server_id: this.clientId, after_version: this.version, onnx: true };
    const call = this.client.WatchWeights(request, authMetadata());
    this.watching = call;
    call.on("data", (weights) => this.received(weights).catch((error) => this.fail(String(error))));
    call.on("error", () => {}); // read from `status`
    call.on("status", (status) => {
      if (status.code === grpc.status.OK && !this.closing) this.move();
      else this.reopen("WatchWeights", (n) => this.watch(n), attempt)(status);
    });
  }

  // The server asked this client to move (WatchWeights ended with OK): SubmitEpisodes half-closed, so that the acks
  // of what it sent come back (within --drain-timeout-s; the rest is sent again), then both streams on a new channel.
  move() {
    const [old, call] = [this.client, this.submit];
    let timer;
    const reopen = () => {
      clearTimeout(timer);
      if (this.closing) return; // the run ended meanwhile: no move
      this.counts.moves += 1;
      this.moving = null;
      old.close();
      this.client = new PolicyService(this.target, grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
      this.watch();
      if (call !== null) this.send(); // (else a retry waiting to reopen it does so on the new channel, or none began)
    };
    if (call === null) return reopen();
    timer = setTimeout(() => call.cancel(), Number(args["drain-timeout-s"]) * 1000);
    [this.submit, this.moving] = [null, { call, reopen }];
    call.end();
  }

  async received(weights) {
    const version = Number(weights.version);
    if (version <= this.version) return;
    this.version = version;
    this.window = Number(weights.max_unacked_steps);
    this.specJson ??= weights.spec_json;
    this.actionKind ??= weights.action_space.kind;
    if (weights.spec_json !== this.specJson) {
      this.fail("the server now serves another run spec: restart this client to act with it");
      return;
    }
    if (weights.onnx.length === 0) {
      this.fail("the server sent no ONNX file with its weights: it predates WatchWeightsRequest.onnx");
      return;
    }
    // Loaded while the step loop goes on with the version it has; one at a time, the newest received next (a
    // version that came while another loaded and is already superseded is never loaded).
    this.newest = weights;
    if (this.loading) return;
    this.loading = true;
    try {
      while (this.newest !== null) {
        const next = this.newest;
        this.newest = null;
        this.pending = { policy: await policyFromBytes(next.onnx), version: Number(next.version) };
        this.changed.fire();
      }
    } finally {
      this.loading = false;
    }
  }

  // The newest version loaded, from this step on (the step loop asks between two steps).
  applyNewest() {
    if (this.failure) throw this.failure;
    if (this.pending !== null) [this.policy, this.pending] = [this.pending, null];
    return this.policy;
  }

  async until(condition) {
    while (!condition()) {
      if (this.failure) throw this.failure;
      await this.changed.promise;
    }
    if (this.failure) throw this.failure;
  }

  send(attempt = 0) {
    const call = this.client.SubmitEpisodes(authMetadata());
    this.submit = call;
    this.counts.streams += 1;
    call.on("data", (ack) => {
      const sent = this.spool.get(ack.seq);
      if (sent === undefined) return;
      this.spool.delete(ack.seq);
      this.room = ack._room === "room" ? Number(ack.room) : null;
      this.counts.acked_batches += 1;
      this.counts.accepted += ack.accepted;
      this.changed.fire();
    });
    call.on("error", () => {});
    call.on("status", (status) => {
      this.room = null; // unknown until the next stream's first ack
      if (this.moving?.call === call) return this.moving.reopen();
      this.submit = null;
      this.reopen("SubmitEpisodes", (n) => this.send(n), attempt)(status);
    });
    call.write({ hello: { client_id: this.clientId, spec_json: this.specJson, num_envs: 1 } });
    for (const [seq, { batch }] of this.spool) call.write({ batch: { ...batch, seq } }); // unacknowledged, in order
  }

  // Chunks into the spool, and onto the stream if one is open (else the next stream sends them).
  ship(chunks) {
    if (chunks.length === 0) return;
    const seq = String(++this.seq);
    const batch = { chunks: [chunkTable(chunks)] };
    const steps = chunks.reduce((n, c) => n + c.steps, 0);
    this.spool.set(seq, { batch, steps });
    Object.assign(this.counts, {
      batches: this.counts.batches + 1,
      chunks: this.counts.chunks + chunks.length,
      steps: this.counts.steps + steps,
    });
    this.submit?.write({ batch: { ...batch, seq } });
  }

  unacked() {
    let steps = 0;
    for (const { steps: n } of this.spool.values()) steps += n;
    return steps;
  }

  // Whether sampling waits: the spool full (--max-spool-bytes: the server away, or not taking batches), or more
  // steps held (unacknowledged, or `unshipped` in the running episode) than the last ack granted; before any ack,
  // the window of unacknowledged steps reached.
  held(unshipped) {
    if (this.spoolFull()) return true;
    const unacked = this.unacked();
    if (this.room !== null) return unacked + unshipped > this.room;
    return this.window > 0 && unacked >= this.window;
  }

  spoolFull() {
    return this.spool.bytes >= this.maxSpoolBytes;
  }

  close() {
    this.closing = true;
    this.watching?.cancel();
    this.moving?.call.cancel();
    this.submit?.end(); // half-close: the server ends the stream with OK
    this.client.close();
    this.spool.close();
  }
}

// --bench: driven as `rlgate bench`'s load processes are (bench/load.py's line protocol): `ready` once the first step
// is taken, then per line on stdin `measure` (a window starts; `measuring`), `report` (one JSON line: env steps,
// seconds, each step's time since the one before in microseconds, this process's CPU seconds) and `stop` (or the end
// of input), which ends the run in place of --steps; the summary is then `{"total_steps": ...}`.
class BenchWindow {
  constructor() {
    this.stopping = false;
    this.total = 0;
    this.window = null;
    const lines = readline.createInterface({ input: process.stdin });
    lines.on("line", (line) => this.command(line.trim()));
    lines.on("close", () => (this.stopping = true));
  }

  command(name) {
    if (name === "measure") {
      this.window = { steps: 0, latencies: [], started: performance.now(), cpu: process.cpuUsage() };
      console.log("measuring");
    } else if (name === "report" && this.window !== null) {
      const { steps, latencies, started, cpu } = this.window;
      const used = process.cpuUsage(cpu);
      const seconds = (performance.now() - started) / 1000;
      const report = { steps, seconds, latency_us: latencies, cpu_s: (used.user + used.system) / 1e6 };
      console.log(JSON.stringify({ ...report, bytes_out: 0, bytes_in: 0 })); // (no step messages: it acts itself)
      this.window = null;
    } else if (name === "stop") {
      this.stopping = true;
    }
  }

  // One env step taken, the one before it (or the start) ended at `since` (performance.now()).
  stepped(since) {
    this.total += 1;
    if (this.total === 1) console.log("ready");
    if (this.window === null) return;
    this.window.steps += 1;
    this.window.latencies.push(Math.round((performance.now() - since) * 1000));
  }
}

async function local() {
  const clientId = args["client-id"] ?? "node-local";
  const steps = Number(args.steps);
  if (!(Number.isInteger(steps) && steps > 0)) fail("--steps is a positive integer");
  const { Env, actions } = envOf(args.env);
  const maxSpoolBytes = Number(args["max-spool-bytes"]);
  if (!(Number.isInteger(maxSpoolBytes) && maxSpoolBytes > 0)) fail("--max-spool-bytes is a positive integer");
  const link = new ServerLink(args.server, clientId, args["spool-dir"], maxSpoolBytes);
  const resent = link.spool.size;
  link.watch();
  await link.until(() => link.pending !== null); // the first version, loaded
  if (link.actionKind !== actions) fail(`served actions are ${link.actionKind}: --env ${args.env} takes ${actions}`);
  link.send();
  let { policy, version } = link.applyNewest();
  const spec = JSON.parse(link.specJson);
  const sessionId = randomUUID().replaceAll("-", "");
  const recorder = new EpisodeRecorder(sessionId, spec.sampling, policy.recordedDtype);
  const env = new Env(Number(args.seed));
  const draw = random(Number(args.seed) + 1);
  const versions = new Set();
  const [returns, terminated] = [[], []];
  let obs = env.reset();
  let episode = policy.newEpisode();
  let [reward, total] = [0, 0];
  recorder.begin(obs);
  const bench = args.bench ? new BenchWindow() : null;
  let taken = 0;
  for (let since = performance.now(); bench === null ? taken < steps : !bench.stopping; taken++) {
    if (link.held(recorder.unshipped())) {
      link.counts.pauses += 1;
      if (link.spoolFull()) {
        link.counts.spool_full += 1;
        console.error(`spool full (${link.spool.bytes} bytes, --max-spool-bytes ${maxSpoolBytes}): sampling waits`);
      } else {
        link.ship(recorder.flush()); // the learner gets the newest steps while sampling waits for its acks
      }
      await link.until(() => !link.held(recorder.unshipped()));
    }
    ({ policy, version } = link.applyNewest());
    versions.add(version);
    const { action, moduleAction, logp, distInputs } = await policy.sample(obs, episode, reward, draw);
    const result = env.step(action); // the env's action; the episode records the module's own
    const acted = { action: moduleAction, logp, distInputs, version };
    link.ship(recorder.step(acted, result.reward, result.obs, result.terminated, result.truncated));
    total += result.reward;
    if (result.terminated || result.truncated) {
      returns.push(total);
      terminated.push(result.terminated);
      obs = env.reset();
      recorder.begin(obs);
      episode = policy.newEpisode();
      [reward, total] = [0, 0];
    } else {
      ({ obs, reward } = result);
    }
    bench?.stepped(since);
    since = performance.now();
  }
  link.ship(recorder.close()); // the running episode, cut off
  // Every batch acknowledged, or --drain-timeout-s passed: what is left unacknowledged is lost (said in the summary).
  const drained = new Promise((resolve) => setTimeout(resolve, Number(args["drain-timeout-s"]) * 1000).unref());
  await Promise.race([link.until(() => link.spool.size === 0), drained]);
  link.close();
  if (bench !== null) return { total_steps: taken };
  return {
    session_id: sessionId,
    env_steps: taken,
    episodes: returns.length,
    returns,
    terminated,
    model_versions: [...versions].sort((a, b) => a - b),
    ...link.counts,
    resent_batches: resent, // found in --spool-dir at the start
    unacknowledged_batches: link.spool.size,
  };
}

const modes = {
  run,
  "in-process": inProcess,
  local,
  "wrong-spaces": wrongSpaces,
  "multi-agent": multiAgent,
  "multi-agent-script": multiAgentScript,
};
if (!(args.mode in modes)) fail(`--mode is one of ${Object.keys(modes).join(", ")}`);
if (!(Number.isInteger(EPISODES) && EPISODES > 0)) fail("--episodes is a positive integer");
if (!(Number(args.envs) >= 1 && Number.isInteger(Number(args.envs)))) fail("--envs is a positive integer");
modes[args.mode]()
  .then((summary) => {
    console.log(JSON.stringify(summary));
    process.exit(0);
  })
  .catch((error) => fail(error.stack ?? String(error)));
