# NVIDIA A100 80GB SXM (HGX/DGX A100, 8 GPUs a node).  Format and fields: docs/profiles.md.
# "datasheet" = NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column); its
# tensor core rates are quoted dense, with the sparse rate (twice) beside them.
name              a100-80g
memory_bytes      80e9       # datasheet: 80 GB HBM2e
peak_flops_f32    19.5e12    # datasheet: FP32 19.5 TFLOPS (CUDA cores)
peak_flops_bf16   312e12     # datasheet: BF16 tensor core 312 TFLOPS dense (624 with sparsity)
gemm_eff          1.7e7:0.12 1.3e8:0.35 1.1e9:0.60 8.6e9:0.75 6.9e10:0.80 5.5e11:0.82  # estimate (M*N*K = 256^3 .. 8192^3): large bf16 cuBLAS GEMMs on A100 reach ~75-80% of dense peak in published GEMM benchmarks (Megatron-LM, Narayanan et al. 2021, reach 52% of peak for a whole 1T-parameter step); `kiln calibrate --device cuda` replaces it
attn_eff          0.6        # estimate: FlashAttention-2 (Dao 2023, arXiv 2307.08691) reaches up to 73% of A100's peak forward and about 63% forward+backward; calibrate replaces it
mem_bw            2.039e12   # datasheet: 2,039 GB/s HBM2e
launch_overhead_s 4e-6       # estimate: a CUDA kernel launch costs a few microseconds (the overhead CUDA Graphs exist to remove); calibrate replaces it
h2d_bw            15e9       # measured host copy rate in the offload systems, 15-21 GB/s on PCIe hosts (DESIGN.md §9.4 after PipeOffload arXiv 2503.01328): the low end for A100's PCIe Gen4 x16 (31.5 GB/s a direction peak)
d2h_bw            15e9       # as h2d_bw
intra_alpha_s     3.4e-6     # NCCL src/graph/tuning.cc hwLat[NVLINK][Ring][Simple]: 3.4 us a ring step (its base latency of 8.4 us a call is left out)
intra_beta        300e9      # datasheet: NVLink 600 GB/s, the sum of both directions: 300 GB/s each way (peak)
inter_alpha_s     9.6e-6     # NCCL src/graph/tuning.cc hwLat[NET][Ring][Simple]: 9.6 us a ring step
inter_beta        25e9       # DGX A100: one ConnectX-6 HDR 200 Gb/s InfiniBand port a GPU: 25 GB/s (link rate)
node_size         8          # DGX/HGX A100: 8 GPUs a node
# cores, threads: not applicable (one device a rank, nothing shared): left out.
host_memory_bytes 250e9      # host memory per GPU for offload (issue 19): NVIDIA DGX A100 640GB datasheet, system memory 2 TB for 8 GPUs
