#pragma once
// The planner options as one table (Note [Plan option fields]): every place that lists them
// (PlanOptions::toString and fromConfig, the plan request text, the CLI's flags) reads it.
//
// Note [Plan option fields]
// Each field is a config key (core/config.cpp) and a member of PlanOptions, with its text form.
// PlanOptions::toString writes the fields in table order as `key=value`; fromConfig sets each
// from the config's text; a plan request's `options` line is parsed field by field; the CLI's
// `autostage plan` and `whatif` take each as `--key-with-dashes`. A new planner option is one
// row here (plus its member and validation), not five lists that drift apart. `usage` is not a
// field: the API that runs a plan sets it (Note [Plan usage]).

#include <string>
#include <vector>

#include "decomposer/plan.h"

namespace autostage::decomposer {

// The config keys of the fields, in table order.
const std::vector<std::string>& planOptionKeys();
// The field's value as text (the form toString writes).
std::string planOptionText(const PlanOptions& options, const std::string& key);
// Sets a field from text; throws ConfigError for an unknown key or text that is not a number
// where the field is one (values are checked by PlanOptions::validate).
void setPlanOption(PlanOptions& options, const std::string& key, const std::string& text);

}  // namespace autostage::decomposer
