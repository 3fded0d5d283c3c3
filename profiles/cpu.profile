# This machine's CPU (2 cores of an AMD EPYC with AVX2/FMA, 25 GB RAM), the
# device of kiln's CPU target.  Measured roughly with profiles/measure_cpu.c
# (its top comment gives the commands) at 06:29 UTC on 2 Dec 2026, load
# average 3.9 on the 2 cores (other jobs running): numbers vary by ~2x from
# run to run.  `kiln calibrate --device cpu` (issue 21) will replace them.
name              cpu
memory_bytes      25.2e9     # `free -b`: 25275990016 bytes of RAM (the device memory of the CPU target is host memory)
peak_flops_f32    30.4e9     # measure_cpu: OpenBLAS sgemm 2048^3, 30.38 GFLOP/s (the best size)
peak_flops_bf16   30.4e9     # the CPU target computes in f32 only (DESIGN §6): same as f32
gemm_eff          2.6e5:0.56 2.1e6:0.54 1.7e7:0.53 1.3e8:0.79 1.1e9:0.84 8.6e9:1.0  # measure_cpu: sgemm n = 64..2048 at 16.9, 16.5, 16.2, 24.1, 25.7, 30.4 GFLOP/s, over the peak
attn_eff          0.6        # bench/RESULTS.md (issue 16 run): kiln's CPU attention, causal, 2 threads: forward 110.5, backward 136.8 GFLOP/s against sgemm's 193.1 in the same run (57%, 71%); kiln calibrate measures it
mem_bw            7.3e9      # measure_cpu: memcpy of 64 MiB, 7.33 GB/s (bytes copied a second; the bus moves twice that)
launch_overhead_s 2.2e-7     # measure_cpu: one 4x4x4 sgemm call, 2.21e-7 s (a library kernel's fixed cost)
h2d_bw            7.3e9      # the CPU back end's host copies are memcpys (issue 19): mem_bw
d2h_bw            7.3e9      # as h2d_bw
intra_alpha_s     2.8e-7     # measure_cpu -DMEASURE_MPI: Open MPI ping-pong, 2 local ranks, 8 bytes: 2.83e-7 s one way
intra_beta        1.86e9     # the same ping-pong, 16 MiB: 0.009 s one way, 1.86 GB/s
inter_alpha_s     2.8e-7     # one host, no network: as intra_alpha_s
inter_beta        1.86e9     # one host, no network: as intra_beta
node_size         4          # the tests run up to 4 ranks on this host (mpirun --oversubscribe)
# cores, threads (processor sharing, cost.c): left out here, so this reference
# profile predicts without it (the tests' numbers and kiln tune's fast path,
# which does not model sharing, stay as they were); `kiln calibrate` writes
# them (2 cores on this machine) and bench/cost_model.sh predicts with those.
host_memory_bytes 6.3e9      # host memory per rank for offload (issue 19): this machine's 25.2 GB of RAM (memory_bytes) over node_size 4 ranks
