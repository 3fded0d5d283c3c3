/* measure_cpu.c — the rough measurements behind profiles/cpu.profile, until
 * `kiln calibrate` (issue 21) replaces them.  Not part of the build:
 *
 *   cc -O2 profiles/measure_cpu.c -o /tmp/measure_cpu -lopenblas -lm && /tmp/measure_cpu
 *
 * It prints OpenBLAS's sgemm rate on square n×n×n GEMMs (best of three
 * timings of a loop lasting at least 0.3 s), memcpy's rate on 64 MiB (bytes
 * copied per second, best of ten) and the time of one 4×4×4 sgemm call (the
 * fixed cost of a library kernel call, the CPU's "launch overhead").  The
 * link numbers come from an MPI ping-pong between two local ranks
 * (mpi_pingpong below, built and run when MEASURE_MPI is defined:
 *   mpicc -O2 -DMEASURE_MPI profiles/measure_cpu.c -o /tmp/pp -lopenblas -lm &&
 *   mpirun --oversubscribe -np 2 /tmp/pp). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef MEASURE_MPI
#include <mpi.h>
#endif

#ifndef MEASURE_MPI
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void gemm(int n, const float *a, const float *b, float *c) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
}

static void sgemm_rates(void) {
    static const int sizes[] = {64, 128, 256, 512, 1024, 2048};
    for (int s = 0; s < 6; s++) {
        int n = sizes[s];
        float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
        for (int i = 0; i < n * n; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
        gemm(n, a, b, c);
        int reps = 1;
        double t;
        for (;; reps *= 2) {
            double t0 = now();
            for (int r = 0; r < reps; r++) gemm(n, a, b, c);
            if ((t = now() - t0) > 0.3) break;
        }
        double best = t / reps;
        for (int k = 0; k < 2; k++) {
            double t0 = now();
            for (int r = 0; r < reps; r++) gemm(n, a, b, c);
            if ((t = (now() - t0) / reps) < best) best = t;
        }
        printf("sgemm n=%d M*N*K=%.3g: %.2f GFLOP/s\n", n, (double)n * n * n, 2.0 * n * n * n / best / 1e9);
        free(a), free(b), free(c);
    }
}

static void memcpy_rate(void) {
    size_t bytes = (size_t)64 << 20;
    char *x = malloc(bytes), *y = malloc(bytes);
    memset(x, 1, bytes), memset(y, 2, bytes);
    double best = 1e9;
    for (int k = 0; k < 10; k++) {
        double t0 = now();
        memcpy(y, x, bytes);
        double t = now() - t0;
        if (t < best) best = t;
    }
    printf("memcpy 64 MiB: %.2f GB/s\n", bytes / best / 1e9);
    free(x), free(y);
}

static void call_overhead(void) {
    float a[16] = {0}, b[16] = {0}, c[16];
    int reps = 200000;
    double t0 = now();
    for (int r = 0; r < reps; r++) gemm(4, a, b, c);
    printf("one 4x4x4 sgemm call: %.3g s\n", (now() - t0) / reps);
}
#endif

#ifdef MEASURE_MPI
/* one-way time of 8 bytes (α) and of 16 MiB (β = bytes / time), best of three */
static void mpi_pingpong(void) {
    int r;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    size_t sizes[2] = {8, (size_t)16 << 20};
    char *buf = calloc(sizes[1], 1);
    for (int s = 0; s < 2; s++) {
        int reps = s ? 20 : 2000;
        double best = 1e9;
        for (int k = 0; k < 3; k++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < reps; i++) {
                if (r == 0) {
                    MPI_Send(buf, (int)sizes[s], MPI_BYTE, 1, 0, MPI_COMM_WORLD);
                    MPI_Recv(buf, (int)sizes[s], MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(buf, (int)sizes[s], MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(buf, (int)sizes[s], MPI_BYTE, 0, 0, MPI_COMM_WORLD);
                }
            }
            double t = (MPI_Wtime() - t0) / reps / 2;
            if (t < best) best = t;
        }
        if (r == 0) printf("p2p %zu bytes: one way %.3g s, %.3g GB/s\n", sizes[s], best, sizes[s] / best / 1e9);
    }
    free(buf);
}
#endif

int main(int argc, char **argv) {
#ifdef MEASURE_MPI
    MPI_Init(&argc, &argv);
    mpi_pingpong();
    MPI_Finalize();
#else
    (void)argc, (void)argv;
    sgemm_rates();
    memcpy_rate();
    call_overhead();
#endif
    return 0;
}
