# NVIDIA H200 SXM (HGX H200, 8 GPUs a node).  Format and fields: docs/profiles.md.
# "datasheet" = NVIDIA H200 Tensor Core GPU datasheet (SXM column); its tensor
# core rates are quoted "with sparsity", the dense rate is half of that.
name              h200-sxm
memory_bytes      141e9      # datasheet: 141 GB HBM3e (the lent H200 reports about 139-140 GiB usable)
peak_flops_f32    67e12      # datasheet: FP32 67 TFLOPS (CUDA cores, dense)
peak_flops_bf16   989.5e12   # datasheet: BF16 tensor core 1,979 TFLOPS with sparsity / 2 = dense
gemm_eff          1.7e7:0.10 1.3e8:0.30 1.1e9:0.55 8.6e9:0.70 6.9e10:0.76 5.5e11:0.78  # estimate (M*N*K = 256^3 .. 8192^3): large bf16 cuBLAS GEMMs reach ~70-80% of dense peak in published GEMM benchmarks, small ones are launch- and wave-bound; `kiln calibrate --device cuda` (issue 21) replaces it
attn_eff          0.5        # estimate: as h100-sxm (the same GH100 die and clocks): FlashAttention-3 75% forward, FlashAttention-2 35%; calibrate replaces it
mem_bw            4.8e12     # datasheet: 4.8 TB/s HBM3e
launch_overhead_s 4e-6       # estimate: a CUDA kernel launch costs a few microseconds (the overhead CUDA Graphs exist to remove); calibrate replaces it
h2d_bw            20e9       # measured host copy rate in the offload systems, 15-21 GB/s on PCIe hosts (DESIGN.md §9.4 after PipeOffload arXiv 2503.01328 and the seeds' 002); the PCIe Gen5 x16 link's peak is 63 GB/s a direction, so this is conservative
d2h_bw            20e9       # as h2d_bw
intra_alpha_s     3.4e-6     # NCCL src/graph/tuning.cc hwLat[NVLINK][Ring][Simple]: 3.4 us a ring step (its base latency of 8.4 us a call is left out)
intra_beta        450e9      # datasheet: NVLink 900 GB/s, the sum of both directions: 450 GB/s each way (peak; NCCL's measured bus bandwidth is lower)
inter_alpha_s     9.6e-6     # NCCL src/graph/tuning.cc hwLat[NET][Ring][Simple]: 9.6 us a ring step
inter_beta        50e9       # one ConnectX-7 NDR 400 Gb/s InfiniBand port a GPU in HGX H200 systems: 50 GB/s (link rate)
node_size         8          # HGX H200: 8 GPUs a node
# cores, threads: not applicable (one device a rank, nothing shared): left out.
host_memory_bytes 250e9      # host memory per GPU for offload (issue 19): NVIDIA DGX H200 datasheet, system memory 2 TB for 8 GPUs
