"""Defaults shared by every training config; experiment files override what differs.

Who reads what: `memagent_jax/experiment/` alone. assembly.py turns the model, agent, data, eval,
mesh and distributed sections into the parts of a run (policy, reader, data, collector, evaluator),
and specs.py turns rl, optim, train, teacher and mesh into the typed specs the trainer, rollouts,
update and optimizer take (docs/DESIGN.md lists them). `memagent_jax/experiment/config_checks.py`
validates every field before any of that. A field that nothing reads would be a flag that does
nothing, so there are none: tests/test_config_reach.py checks that every field is read outside
validation and that each agent, data, rl and teacher field changes what a run does.
"""

import ml_collections


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  del variant
  c = ml_collections.ConfigDict()

  c.model = ml_collections.ConfigDict(dict(
      source="random:tiny-smollm2",  # load_policy source: preset, HF dir, .gguf, hub id, random:<preset>
      dtype="float32",  # float32 on CPU; bfloat16 on accelerators
      seed=0,  # init seed for random:<preset>
      # what the training forward keeps for the backward pass, per block: none (everything) | dots (matmul
      # outputs; recompute norms, RoPE, softmax, SwiGLU) | full (only the block input: least memory)
      remat="none",
      attention="auto",  # attention backend: auto (by platform) | xla (portable) | cudnn (GPU) | splash (TPU)
      # training and log-prob forwards run the layers as one lax.scan over stacked weights (XLA keeps one
      # layer's recomputed activations live, and compiles one block); False unrolls them. Decoding is unrolled
      scan_layers=True,
  ))
  c.agent = ml_collections.ConfigDict(dict(
      chunk_tokens=5000,  # tokens per chunk the agent reads (toy documents keep each fact inside one)
      memory_tokens=1024, answer_tokens=1024, question_tokens=1024,
      final_template="boxed", block_chunks=8,
      # reuse the template's opening piece's keys across rows and each row's question's across its
      # chunks: auto (when the piece is >= 10% of the prompt and attention runs on xla, e.g. the toy
      # world) | on | off; the same tokens, log-probs equal up to float rounding (~1e-5)
      template_prefix_cache="auto",
      max_chunks=0,  # training-time centre truncation to this many chunks; 0 = read everything
      kind="memagent",  # "memagent", or "direct": the whole document in one prompt (full-attention baseline)
      context_tokens=0,  # direct only: context window (0 = the model's); evaluation centre-truncates beyond
      # "overwrite" (MemAgent: every memory turn writes a new memory) | "gated": a memory turn may reply
      # with a short form instead (agent/gates.py): <keep> leaves the memory unchanged, <stop> ends reading
      memory="overwrite",
      gate_forms="keep",  # gated only: "keep" (<keep>) | "keep_stop" (<keep> and <stop>)
      invalid_gate="as_memory",  # gated only: a reply holding a form but more than it: "as_memory" | "keep"
      # memory turns run only the rows still working, gathered into the smallest of this many batch sizes
      # (each half the next; policy/compaction.py): rows that read no chunk skip the prefill and, when
      # gated, rows that replied with a form stop decoding. 1: every row runs every turn (no gather)
      decode_buckets=1,
  ))
  c.data = ml_collections.ConfigDict(dict(
      task="niah_single_1",  # a memagent_jax.data.tasks name (RULER, squad, hotpotqa, jsonl, toy_kv)
      length=4096,  # context tokens of training documents
      data_dir="",  # local corpus for QA tasks: the training file (or a dir holding it; jsonl: the file)
      train_size=1024,  # questions in the training pool (reshuffled every epoch)
      tfds="",  # '<builder>/<config>' (experiment/tfds_builders.py): train on that prepared array_record set
      tfds_split="train",  # its split ("test" for the synthetic builders)
      tfds_dir="",  # where it is prepared ("" = runs/tfds); QA corpora come from data.data_dir
      seed=0,
      # generator options of the task (tasks.TOY_OPTIONS for the toy world, e.g. distractor_density);
      # training pool and held-out split only: length sweeps evaluate the task as it is
      options=ml_collections.ConfigDict(),
      # a data curriculum: "<until step>:<option>=<value>,...;..." trains each step range on documents
      # generated with those data.options (memagent_jax/data/curriculum.py); "" = one phase
      phases="",
  ))
  c.rl = ml_collections.ConfigDict(dict(
      group_size=16,  # G trajectories per question
      questions_per_step=128,
      ppo_mini_batch=8,  # questions per optimizer update -> questions_per_step / ppo_mini_batch updates
      micro_batches=1,  # gradient accumulation per update
      rollout_batch=256,  # trajectories per agent call (a multiple of group_size)
      temperature=1.0, top_p=1.0,
      reward="memagent_verifier",
      advantage="mean_centred",  # r - group mean (released MemAgent); "grpo": / group std; "batch_std": / step std
      eps=1e-6,
      loss="ppo_clip", agg="token-mean",
      clip_low=0.2, clip_high=0.2, clip_c=3.0,  # clip_c 0 disables the dual clip
      kl_coef=0.001, kl_kind="low_var_kl",
      entropy_coef=0.0,
      recompute_old_logprobs=True,  # old log-probs from the training forward (as verl), not the sampler
      dynamic_sampling=False, max_extra_gen_batches=0,
      on_insufficient="fail",  # when dynamic sampling runs out: "fail" or "proceed" with fewer groups
      # what a group must show to be kept: "score" (DAPO: its answers' scores differ) | "score_or_gates"
      # (or, with gate terms weighed, its gate terms differ: rl/rollout.py DYNAMIC_SAMPLING_FILTERS)
      dynamic_sampling_filter="score",
      mask_truncated=False,  # drop conversations that hit their token cap from the loss
      overlong=ml_collections.ConfigDict(dict(enable=False, max_tokens=1024, cache_tokens=256)),
      # gated memory (agent.memory="gated"): weights of the gate terms added to the final reward
      # (rl/gate_signals.py): keep (keeping, signed by the answer), exit (stopping early, signed),
      # format (invalid replies), evidence (writing where the chunk holds a gold answer, keeping where
      # not: extractive answers only); 0 = the final reward alone
      gate_rewards=ml_collections.ConfigDict(dict(keep=0.0, exit=0.0, format=0.0, evidence=0.0)),
      # "trajectory": every turn gets its trajectory's advantage (Multi-Conv DAPO) | "turn_mix":
      # (1 - turn_advantage_weight) x that + turn_advantage_weight x the turn's own (group-centred)
      advantage_mode="trajectory",
      turn_advantage_weight=0.5,  # "turn_mix" only, in [0, 1]
  ))
  c.teacher = ml_collections.ConfigDict(dict(  # read when train.source == "teacher"
      name="toy_memory",  # a memagent_jax.rl.toy_teacher.TEACHERS entry
      options=ml_collections.ConfigDict(dict(overwrite_prob=0.3)),  # keyword arguments of the teacher
      prompt_loss=False,  # also train on prompt tokens (next-token loss on whole conversations)
  ))
  c.optim = ml_collections.ConfigDict(dict(
      lr=1e-6, schedule="constant", warmup_steps=20, min_lr_ratio=0.0,
      weight_decay=0.01, grad_clip=1.0, b1=0.9, b2=0.999, eps=1e-8,
  ))
  c.train = ml_collections.ConfigDict(dict(
      steps=200, seed=0, workdir="runs/default",
      source="rollout",  # "rollout": RL on the agent's own trajectories; "teacher": supervised (rl.loss "sft")
      save_every=10, keep_checkpoints=3, async_checkpoint=True,
      log_every=1, max_nan_steps=3,  # consecutive non-finite updates before training stops
      progress=True,
      # persistent XLA compilation cache shared by runs ("" = off): a restart or a sweep's next run
      # reuses the rollout/update programs instead of compiling them again
      compilation_cache_dir="",
  ))
  c.eval = ml_collections.ConfigDict(dict(
      every=0,  # steps between evaluations on the held-out split; 0 = off
      size=64, seed=12345, length=0,  # length 0 = the training length
      data_dir="",  # held-out corpus for QA tasks (e.g. the dev file); "" = data.data_dir
      temperature=1.0, top_p=0.7, batch_size=16,  # released validation sampling
  ))
  c.mesh = ml_collections.ConfigDict(dict(
      data=-1, fsdp=1, tensor=1,  # -1: the remaining devices
      rules=(),  # extra (logical, mesh axis) rules overriding the defaults in runtime/parallel.py
      # the weight layout rollouts decode with: "train" (the training layout; FSDP-sharded weights are
      # gathered at every decoded token) | "replicated" (re-sharded once per step: tensor-parallel over
      # "tensor", whole over data x fsdp, so decoding moves no weights; needs params / tensor per chip)
      rollout="train",
  ))
  # 0 / "" / -1: from JAX_NUM_PROCESSES, JAX_COORDINATOR_ADDRESS, JAX_PROCESS_ID; without a process
  # count, cluster="auto" joins a cluster jax.distributed.initialize() detects (Slurm, multi-host TPU
  # VM, GKE), else one process; "none": never (docs/pods.md)
  c.distributed = ml_collections.ConfigDict(dict(num_processes=0, coordinator_address="", process_id=-1,
                                                 cluster="auto"))
  return c
