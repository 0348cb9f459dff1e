// OamBridgeSubsystem.cpp - the Unreal layer over the engine-agnostic core (Core/oam_client.h).
#include "OamBridgeSubsystem.h"

#include "Async/Async.h"
#include "HAL/PlatformMisc.h"
#include "Misc/Paths.h"

#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "oam_client.h"
#include "oam_process.h"

namespace
{
FString ToFString(const std::string& S)
{
	return FString(UTF8_TO_TCHAR(S.c_str()));
}

std::string ToStd(const FString& S)
{
	return std::string(TCHAR_TO_UTF8(*S));
}

// "" -> fallback; invalid JSON -> discarded (is_discarded()).
oam::json ParseJson(const FString& Text, oam::json Fallback)
{
	if (Text.TrimStartAndEnd().IsEmpty())
	{
		return Fallback;
	}
	return oam::json::parse(ToStd(Text), nullptr, false);
}

FString Dump(const oam::json& J)
{
	return ToFString(J.dump(-1, ' ', false, oam::json::error_handler_t::replace));
}

std::string Str(const oam::json& Params, const char* Key)
{
	return oam::stringField(Params, Key);
}

std::vector<std::string> ToStdList(const TArray<FString>& Strings)
{
	std::vector<std::string> Out;
	for (const FString& S : Strings)
	{
		Out.push_back(ToStd(S));
	}
	return Out;
}

// The result of a request waited for on the game thread, or nullopt (logged) after the timeout or
// on an error. The future is settled on the reader thread, never the game thread, so waiting is safe.
std::optional<oam::json> WaitResult(std::future<oam::json> F, float TimeoutSeconds, const FString& What)
{
	const auto Timeout = std::chrono::milliseconds(static_cast<long long>(TimeoutSeconds * 1000.f));
	if (F.wait_for(Timeout) != std::future_status::ready)
	{
		UE_LOG(LogOamBridge, Warning, TEXT("%s: timed out"), *What);
		return std::nullopt;
	}
	try
	{
		return F.get();
	}
	catch (const oam::BridgeError& E)
	{
		UE_LOG(LogOamBridge, Warning, TEXT("%s: %s"), *What, UTF8_TO_TCHAR(E.what()));
		return std::nullopt;
	}
}
}  // namespace

UOamBridgeSubsystem::UOamBridgeSubsystem() = default;
UOamBridgeSubsystem::~UOamBridgeSubsystem() = default;

void UOamBridgeSubsystem::Initialize(FSubsystemCollectionBase& Collection)
{
	Super::Initialize(Collection);
	bClosing = false;

	FString Command = FPlatformMisc::GetEnvironmentVariable(TEXT("OAM_BRIDGE_CMD"));
	if (Command.IsEmpty())
	{
		Command = BridgeCommand;
	}
	const FString Dir = FPaths::ConvertRelativePathToFull(FPaths::Combine(FPaths::ProjectDir(), BridgeWorkingDirectory));

	oam::ClientOptions Options;
	Options.command = oam::splitCommandLine(ToStd(Command));
	Options.workingDirectory = ToStd(Dir);
	Options.onLog = [](const std::string& Line)  // any thread; UE_LOG is thread-safe
	{ UE_LOG(LogOamBridge, Log, TEXT("%s"), UTF8_TO_TCHAR(Line.c_str())); };
	// Every core callback (events, tool handlers, request callbacks) runs on the game thread,
	// and not at all once this subsystem is gone or closing: the handlers below capture `this`
	// safely because they only ever run inside this check.
	TWeakObjectPtr<UOamBridgeSubsystem> WeakThis(this);
	Options.dispatcher = [WeakThis](std::function<void()> Fn)
	{
		AsyncTask(ENamedThreads::GameThread, [WeakThis, Fn = MoveTemp(Fn)]()
			{
				const UOamBridgeSubsystem* Self = WeakThis.Get();
				if (Self && !Self->bClosing)
				{
					Fn();
				}
			});
	};

	try
	{
		Client = MakeUnique<oam::Client>(std::move(Options));
	}
	catch (const std::exception& E)
	{
		UE_LOG(LogOamBridge, Error, TEXT("could not start the bridge (%s): %s"), *Command, UTF8_TO_TCHAR(E.what()));
		return;
	}
	UE_LOG(LogOamBridge, Log, TEXT("started the bridge: %s (pid %ld) in %s"), *Command, Client->pid(), *Dir);

	Client->on("turn/started", [this](const oam::Event& E)
		{
			OnTurnStarted.Broadcast(ToFString(E.npcId()), ToFString(E.turnId()),
				ToFString(oam::stringField(E.params, "kind", "respond")), ToFString(Str(E.params, "speaker")),
				ToFString(Str(E.params, "prompt")));
		});
	Client->on("turn/textDelta", [this](const oam::Event& E)
		{
			OnTextDelta.Broadcast(ToFString(E.npcId()), ToFString(E.turnId()), ToFString(Str(E.params, "delta")),
				oam::boolField(E.params, "isReset"));
		});
	Client->on("turn/toolCallRequested", [this](const oam::Event& E)
		{
			OnToolCallRequested.Broadcast(ToFString(E.npcId()), ToFString(E.turnId()), ToFString(Str(E.params, "callId")),
				ToFString(Str(E.params, "name")), Dump(E.params.contains("arguments") ? E.params["arguments"] : oam::json::object()));
		});
	// Requests are pipelined: npc/create and the rest may be sent before this answers.
	Client->request("initialize",
		{{"protocolVersion", 1}, {"clientInfo", {{"name", "oam-unreal"}, {"version", "0.1.0"}}}},
		[](const oam::Response& R)
		{
			if (!R.ok())
			{
				UE_LOG(LogOamBridge, Error, TEXT("initialize failed: %s"), UTF8_TO_TCHAR(R.error->what()));
			}
		});
}

void UOamBridgeSubsystem::Deinitialize()
{
	bClosing = true;
	if (Client)
	{
		// stdin EOF: the bridge cancels its turns and exits 0; close() waits, joins its threads.
		const int Code = Client->close();
		UE_LOG(LogOamBridge, Log, TEXT("the bridge exited with status %d"), Code);
		Client.Reset();
	}
	Super::Deinitialize();
}

static void LogIfFailed(const char* What, const oam::Response& R)
{
	if (!R.ok())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("%s failed: %s (%s)"), UTF8_TO_TCHAR(What), UTF8_TO_TCHAR(R.error->what()),
			UTF8_TO_TCHAR(R.error->code.c_str()));
	}
}

bool UOamBridgeSubsystem::CreateNpc(const FString& NpcId, const FString& Instructions, const FString& ExtraParamsJson)
{
	oam::json Params = ParseJson(ExtraParamsJson, oam::json::object());
	if (!Client || !Params.is_object())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("CreateNpc(%s): no bridge, or ExtraParamsJson is not a JSON object"), *NpcId);
		return false;
	}
	Params["npcId"] = ToStd(NpcId);
	if (!Instructions.IsEmpty())
	{
		Params["instructions"] = ToStd(Instructions);
	}
	Client->request("npc/create", std::move(Params), [](const oam::Response& R) { LogIfFailed("npc/create", R); });
	return true;
}

// OnDecision (decide turns), OnTurnCompleted or OnTurnFailed when a turn ends; on the game thread,
// only while Self is alive (the dispatcher checks).
static oam::Turn::Callbacks TurnCallbacks(UOamBridgeSubsystem* Self)
{
	oam::Turn::Callbacks Callbacks;
	Callbacks.onFinished = [Self](const oam::Turn& Turn)
	{
		const FString Npc = ToFString(Turn.npcId());
		const FString TurnId = ToFString(Turn.turnId());
		try
		{
			const oam::json Completed = Turn.completion().get();
			if (Turn.kind() == "decide")
			{
				const oam::json Answer = Completed.contains("json") ? Completed["json"] : oam::json();
				const bool bHasArguments = Answer.is_object() && Answer.contains("arguments");
				Self->OnDecision.Broadcast(Npc, TurnId, ToFString(Str(Answer, "choice")), ToFString(Str(Answer, "reasoning")),
					bHasArguments ? Dump(Answer["arguments"]) : FString());
			}
			Self->OnTurnCompleted.Broadcast(Npc, TurnId, ToFString(Str(Completed, "text")), Dump(Completed),
				ToFString(Str(Completed, "finishReason")), static_cast<int32>(oam::intField(Completed, "worldRevision")));
		}
		catch (const oam::BridgeError& E)
		{
			Self->OnTurnFailed.Broadcast(Npc, TurnId, ToFString(E.code), UTF8_TO_TCHAR(E.what()));
		}
	};
	return Callbacks;
}

bool UOamBridgeSubsystem::Respond(const FString& NpcId, const FString& Prompt, const FString& OptionsJson)
{
	return StartRespond(NpcId, Prompt, OptionsJson, FString());
}

bool UOamBridgeSubsystem::RespondToSpeaker(const FString& NpcId, const FString& Speaker, const FString& Prompt,
	const FString& OptionsJson)
{
	return StartRespond(NpcId, Prompt, OptionsJson, Speaker);
}

bool UOamBridgeSubsystem::StartRespond(const FString& NpcId, const FString& Prompt, const FString& OptionsJson,
	const FString& Speaker)
{
	oam::json Options = ParseJson(OptionsJson, oam::json::object());
	if (!Client || !Options.is_object())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("Respond(%s): no bridge, or OptionsJson is not a JSON object"), *NpcId);
		return false;
	}
	if (!Speaker.IsEmpty())
	{
		Options["speaker"] = ToStd(Speaker);
	}
	if (!DefaultGuardrail.IsEmpty() && !Options.contains("guardrail"))
	{
		Options["guardrail"] = ToStd(DefaultGuardrail);
	}
	Client->respond(ToStd(NpcId), ToStd(Prompt), std::move(Options), TurnCallbacks(this));
	return true;
}

bool UOamBridgeSubsystem::Decide(const FString& NpcId, const FString& Situation, const FString& OptionsJson,
	bool bReasoning, bool bRemember)
{
	oam::json Options = ParseJson(OptionsJson, oam::json());
	if (!Client || !Options.is_array())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("Decide(%s): no bridge, or OptionsJson is not a JSON array of options"), *NpcId);
		return false;
	}
	Client->decide(ToStd(NpcId), ToStd(Situation), std::move(Options), {{"reasoning", bReasoning}, {"remember", bRemember}},
		TurnCallbacks(this));
	return true;
}

bool UOamBridgeSubsystem::Prewarm(const FString& NpcId)
{
	if (!Client)
	{
		return false;
	}
	Client->prewarm(ToStd(NpcId), TurnCallbacks(this));
	return true;
}

bool UOamBridgeSubsystem::SetTags(const FString& NpcId, const TArray<FString>& Tags)
{
	if (!Client)
	{
		return false;
	}
	Client->request("npc/setTags", {{"npcId", ToStd(NpcId)}, {"tags", ToStdList(Tags)}},
		[](const oam::Response& R) { LogIfFailed("npc/setTags", R); });
	return true;
}

// world/set with these params (key, value, scope); OnWorldChanged when it succeeded.
static void SendWorldSet(UOamBridgeSubsystem* Self, oam::json Params)
{
	const FString Key = ToFString(Str(Params, "key"));
	Self->GetClient()->request("world/set", std::move(Params), [Self, Key](const oam::Response& R)
		{
			LogIfFailed("world/set", R);
			if (R.ok())
			{
				Self->OnWorldChanged.Broadcast(Key, static_cast<int32>(oam::intField(R.result, "revision")));
			}
		});
}

static oam::json WorldSetParams(const FString& Key, oam::json Value, const TArray<FString>& Tags,
	const TArray<FString>& NpcIds, bool bLore)
{
	oam::json Params = {{"key", ToStd(Key)}, {"value", std::move(Value)}};
	if (Tags.Num() > 0)
	{
		Params["tags"] = ToStdList(Tags);
	}
	if (NpcIds.Num() > 0)
	{
		Params["npcIds"] = ToStdList(NpcIds);
	}
	if (bLore)
	{
		Params["lore"] = true;
	}
	return Params;
}

bool UOamBridgeSubsystem::SetWorldFact(const FString& Key, const FString& Value, const TArray<FString>& Tags,
	const TArray<FString>& NpcIds, bool bLore)
{
	if (!Client)
	{
		return false;
	}
	SendWorldSet(this, WorldSetParams(Key, oam::json(ToStd(Value)), Tags, NpcIds, bLore));
	return true;
}

bool UOamBridgeSubsystem::SetWorldFactJson(const FString& Key, const FString& ValueJson, const TArray<FString>& Tags,
	const TArray<FString>& NpcIds, bool bLore)
{
	oam::json Value = ParseJson(ValueJson, nullptr);
	if (!Client || Value.is_discarded() || Value.is_null())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("SetWorldFactJson(%s): no bridge, or ValueJson is not JSON (or null: use DeleteWorldFact)"), *Key);
		return false;
	}
	SendWorldSet(this, WorldSetParams(Key, std::move(Value), Tags, NpcIds, bLore));
	return true;
}

bool UOamBridgeSubsystem::DeleteWorldFact(const FString& Key)
{
	if (!Client)
	{
		return false;
	}
	Client->request("world/delete", {{"key", ToStd(Key)}}, [this, Key](const oam::Response& R)
		{
			LogIfFailed("world/delete", R);
			if (R.ok() && oam::boolField(R.result, "deleted"))
			{
				OnWorldChanged.Broadcast(Key, static_cast<int32>(oam::intField(R.result, "revision")));
			}
		});
	return true;
}

FString UOamBridgeSubsystem::GetWorld(const FString& NpcId)
{
	if (!Client)
	{
		return FString();
	}
	const std::optional<oam::json> R = WaitResult(Client->worldGet(ToStd(NpcId)), RequestTimeoutSeconds, TEXT("GetWorld"));
	return R ? Dump(*R) : FString();
}

bool UOamBridgeSubsystem::RestoreWorld(const FString& WorldJson)
{
	const oam::json World = ParseJson(WorldJson, nullptr);
	if (!Client || !World.is_object() || !World.contains("facts") || !World["facts"].is_array())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("RestoreWorld: no bridge, or WorldJson is not GetWorld's {\"facts\": [...]}"));
		return false;
	}
	for (const oam::json& Fact : World["facts"])
	{
		SendWorldSet(this, Fact);  // a fact's fields are world/set's params: key, value, npcIds, tags, lore
	}
	return true;
}

bool UOamBridgeSubsystem::SubmitToolOutput(const FString& NpcId, const FString& CallId, const FString& OutputJson)
{
	oam::json Output = ParseJson(OutputJson, nullptr);
	if (!Client || Output.is_discarded())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("SubmitToolOutput(%s): no bridge, or OutputJson is not JSON"), *CallId);
		return false;
	}
	Client->request("npc/submit", {{"npcId", ToStd(NpcId)}, {"callId", ToStd(CallId)}, {"output", std::move(Output)}},
		[](const oam::Response& R) { LogIfFailed("npc/submit", R); });
	return true;
}

bool UOamBridgeSubsystem::SubmitToolError(const FString& NpcId, const FString& CallId, const FString& Error)
{
	if (!Client)
	{
		return false;
	}
	Client->request("npc/submit", {{"npcId", ToStd(NpcId)}, {"callId", ToStd(CallId)}, {"error", ToStd(Error)}},
		[](const oam::Response& R) { LogIfFailed("npc/submit", R); });
	return true;
}

bool UOamBridgeSubsystem::Cancel(const FString& NpcId)
{
	if (!Client)
	{
		return false;
	}
	Client->request("npc/cancel", {{"npcId", ToStd(NpcId)}}, [](const oam::Response& R) { LogIfFailed("npc/cancel", R); });
	return true;
}

FString UOamBridgeSubsystem::SaveTranscript(const FString& NpcId)
{
	if (!Client)
	{
		return FString();
	}
	const std::optional<oam::json> R = WaitResult(Client->transcript(ToStd(NpcId)), RequestTimeoutSeconds,
		FString(TEXT("SaveTranscript ")) + NpcId);
	return R ? Dump(*R) : FString();
}

bool UOamBridgeSubsystem::RestoreTranscript(const FString& SaveJson, const FString& NpcId)
{
	oam::json Save = ParseJson(SaveJson, nullptr);
	if (!Client || !Save.is_object())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("RestoreTranscript: no bridge, or SaveJson is not a JSON object"));
		return false;
	}
	const std::optional<oam::json> R = WaitResult(Client->restore(std::move(Save), ToStd(NpcId)), RequestTimeoutSeconds,
		TEXT("RestoreTranscript"));
	if (!R)
	{
		return false;
	}
	UE_LOG(LogOamBridge, Log, TEXT("restored %s with %d turns"), *ToFString(Str(*R, "npcId")), static_cast<int>(oam::intField(*R, "turns")));
	return true;
}

bool UOamBridgeSubsystem::IsBridgeRunning() const
{
	return Client && Client->running();
}
