/* Fuzz target: a chat template (the input), parsed and, when the engine
 * accepts it, rendered with a fixed conversation. Whatever the template
 * does, the render ends (bounded steps, memory, output and nesting) with a
 * text or an error. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *vars;
    if (!vars)
        vars = json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
                          "\"content\": \"Hi \\u00e9\\ud83d\\ude00\"}, {\"role\": \"assistant\", \"content\": "
                          "\"<think>\\nr\\n</think>\\n\\nHello\", \"reasoning_content\": \"r\"}, {\"role\": \"user\", "
                          "\"content\": \"\"}], \"add_generation_prompt\": true, \"bos_token\": \"<s>\", "
                          "\"eos_token\": \"</s>\", \"tools\": null, \"enable_thinking\": false}",
                          0, NULL);
    char *err = NULL;
    JinjaTemplate *t = jinja_parse("fuzz", (const char *)data, size, &err);
    free(err);
    if (!t) return 0;
    size_t len;
    err = NULL;
    free(jinja_render(t, vars, 0, &len, &err));
    free(err);
    jinja_free(t);
    return 0;
}
