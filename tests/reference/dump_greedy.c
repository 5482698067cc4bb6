// Reference dump from llama.cpp's C API: for each prompt, the prompt's token ids, the greedy
// continuation (token ids and text) and the top-10 raw logits of the first steps, as JSON lines.
// Built and run by tests/reference/make_llama_refs.sh against a llama.cpp build outside the repo.
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void json_str(const char *s, int n) {
    putchar('"');
    for (int i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') printf("\\n");
        else if (c == '\t') printf("\\t");
        else if (c == '\r') printf("\\r");
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: %s MODEL N_PREDICT N_LOGIT_STEPS PROMPT...\n", argv[0]); return 1; }
    int n_predict = atoi(argv[2]), n_logit_steps = atoi(argv[3]);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    for (int a = 4; a < argc; a++) {
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 1024; cp.n_batch = 512; cp.n_threads = 2; cp.n_threads_batch = 2;
        // The reference mode: batched prompt, no flash attention (f32 softmax·V; the CPU flash path
        // accumulates V in f16). REF_FLASH_ATTN=1 and REF_ONE_BY_ONE=1 give the other modes, used
        // to measure how far llama.cpp's own results move.
        cp.flash_attn_type = getenv("REF_FLASH_ATTN") ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
        struct llama_context *ctx = llama_init_from_model(model, cp);
        const char *prompt = argv[a];
        llama_token toks[1024];
        int n = llama_tokenize(vocab, prompt, strlen(prompt), toks, 1024, true, true);
        printf("{\"prompt\":"); json_str(prompt, strlen(prompt));
        printf(",\"prompt_ids\":[");
        for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", toks[i]);
        printf("],\"ids\":[");
        struct llama_batch batch = llama_batch_get_one(toks, n);
        if (getenv("REF_ONE_BY_ONE")) {
            for (int i = 0; i + 1 < n; i++) llama_decode(ctx, llama_batch_get_one(&toks[i], 1));
            batch = llama_batch_get_one(&toks[n - 1], 1);
        }
        char text[65536]; int text_len = 0;
        char steps[65536]; int steps_len = 0;
        for (int step = 0; step < n_predict; step++) {
            if (llama_decode(ctx, batch)) { fprintf(stderr, "decode failed\n"); return 1; }
            float *logits = llama_get_logits_ith(ctx, -1);
            int best = 0;
            for (int i = 1; i < n_vocab; i++) if (logits[i] > logits[best]) best = i;
            if (step < n_logit_steps) {
                int top[10]; int nt = 0;
                for (int k = 0; k < 10; k++) {
                    int bi = -1;
                    for (int i = 0; i < n_vocab; i++) {
                        int used = 0; for (int j = 0; j < nt; j++) if (top[j] == i) used = 1;
                        if (!used && (bi < 0 || logits[i] > logits[bi])) bi = i;
                    }
                    top[nt++] = bi;
                }
                steps_len += sprintf(steps + steps_len, "%s[", step ? "," : "");
                for (int k = 0; k < 10; k++)
                    steps_len += sprintf(steps + steps_len, "%s[%d,%.6f]", k ? "," : "", top[k], logits[top[k]]);
                steps_len += sprintf(steps + steps_len, "]");
            }
            printf(step ? ",%d" : "%d", best);
            char piece[256];
            int pn = llama_token_to_piece(vocab, best, piece, sizeof piece, 0, false);
            if (pn > 0 && text_len + pn < (int)sizeof text) { memcpy(text + text_len, piece, pn); text_len += pn; }
            if (llama_vocab_is_eog(vocab, best)) break;
            static llama_token next; next = best;
            batch = llama_batch_get_one(&next, 1);
        }
        printf("],\"text\":"); json_str(text, text_len);
        printf(",\"top_logits\":[%s]}\n", steps);
        fflush(stdout);
        llama_free(ctx);
    }
    llama_model_free(model);
    return 0;
}
